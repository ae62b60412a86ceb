"""Screenshots of the MLflow UI over a sweep, in headless Chromium (playwright, outside the project's venv).

python -m venv /tmp/ui && /tmp/ui/bin/pip install playwright     # uses the system chromium, no download
make ui UI_PORT=5055 &                                              # or mlflow ui ... --workers 1
/tmp/ui/bin/python results/ui/shots.py http://127.0.0.1:5055 <experiment id> results/ui
"""

import sys

from playwright.sync_api import sync_playwright

base, exp, out = sys.argv[1], sys.argv[2], sys.argv[3]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
    pg = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()  # a fresh browser: no saved state
    pg.goto(f"{base}/#/experiments/{exp}?workflowType=machine_learning")
    pg.wait_for_timeout(6000)
    if pg.get_by_role("button", name="Close").count():  # the assistant panel
        pg.get_by_role("button", name="Close").first.click()
    pg.screenshot(path=f"{out}/ui1_runs.png")  # opens on the runs table
    pg.get_by_text("Group by", exact=True).click()
    pg.wait_for_timeout(1000)
    pg.get_by_text("axis.algorithm", exact=True).first.click()
    pg.wait_for_timeout(1500)
    pg.keyboard.press("Escape")
    pg.screenshot(path=f"{out}/ui2_grouped_table.png")  # one group per algorithm, no warm-start run among them
    pg.mouse.click(296, 120)  # the chart view (second icon of the view switch)
    pg.wait_for_timeout(5000)
    pg.screenshot(path=f"{out}/ui3_charts.png")
    pg.get_by_placeholder("Search metric charts").first.fill("eval_vs_samples")
    pg.wait_for_timeout(4000)
    pg.screenshot(path=f"{out}/ui5_eval_vs_samples.png")  # budget-matched: x = samples seen, every eval point
    pg.get_by_label("Toggle visibility of runs").first.click()
    pg.wait_for_timeout(1000)
    pg.screenshot(path=f"{out}/ui7_visibility_menu.png")  # Show first 10 / 20 / all runs
    browser.close()
