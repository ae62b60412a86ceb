"""Library calls in place of hand-written code (issue 42) give what the code they replaced gave. Each old version is
kept here as the reference and compared on random inputs: the padding (torch's pad_sequence / F.pad) on ragged inputs of
every dtype the callers pass (token ids, float masks and log-probs, bool flags), left and right; the AUC (np.trapezoid)
on scalar and per-problem curves; the mean's interval and standard error (scipy.stats.sem)."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from bench.engine.rollout import _pad_cat


def old_pad_cat(tensors, value, left):
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = t.new_full((t.shape[0], width - t.shape[1]), value)
        padded.append(torch.cat([pad, t], 1) if left else torch.cat([t, pad], 1))
    return torch.cat(padded, 0)


def old_gather_pad(x, width, most, pad_value, left):
    """bench/dist.py gather_rows' two pads before all_gather: columns to ``width``, rows to ``most``."""
    if x.shape[1] < width:
        pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), pad_value)
        x = torch.cat([pad, x], 1) if left else torch.cat([x, pad], 1)
    if x.shape[0] < most:
        x = torch.cat([x, x.new_full((most - x.shape[0], *x.shape[1:]), pad_value)])
    return x


def old_collate(rows, pad_id):
    """bench/task.py collate_demonstrations' loop: prompt + completion right-padded, labels -100 off the completion."""
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        ids[i, :n] = torch.tensor(p + c)
        labels[i, len(p) : n] = torch.tensor(c)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def old_tree_rows(seqs, logps, pad):
    """bench/engine/tree.py's leaves -> (ids, mask, logp), right-padded to the longest (at least 1)."""
    T = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask, logp = torch.zeros(len(seqs), T), torch.zeros(len(seqs), T)
    for i, (s, lp) in enumerate(zip(seqs, logps, strict=True)):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
        logp[i, : len(s)] = torch.tensor(lp)
    return ids, mask, logp


DTYPES = st.sampled_from([torch.long, torch.float32, torch.bool])
ragged = st.lists(st.lists(st.integers(0, 99), min_size=0, max_size=7), min_size=1, max_size=5)


@given(
    shapes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=4),
    left=st.booleans(),
    dtype=DTYPES,
    value=st.integers(0, 5),
)
def test_rollout_merge_padding_equals_the_loop(shapes, left, dtype, value):
    g = torch.Generator().manual_seed(len(shapes))
    tensors = [torch.randint(0, 9, s, generator=g).to(dtype) for s in shapes]
    value = bool(value) if dtype == torch.bool else value
    # parts with no rows included, all of them too (dynamic sampling can keep no group in a round): the same shape
    got, want = _pad_cat(tensors, value, left), old_pad_cat(tensors, value, left)
    assert got.dtype == want.dtype and torch.equal(got, want)


@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 5),
    extra=st.integers(0, 3),
    more=st.integers(0, 3),
    left=st.booleans(),
    trailing=st.booleans(),
    dtype=DTYPES,
)
def test_gather_rows_padding_equals_the_loop(rows, cols, extra, more, left, trailing, dtype):
    from bench.dist import pad_for_gather

    shape = (rows, cols, 2) if trailing else (rows, cols)
    x = torch.randint(0, 9, shape).to(dtype)
    value = False if dtype == torch.bool else 3
    got = pad_for_gather(x, cols + extra, rows + more, value, left)
    assert torch.equal(got, old_gather_pad(x, cols + extra, rows + more, value, left))


@given(prompts=ragged, completions=ragged, pad_id=st.integers(0, 3))
def test_sft_collate_equals_the_loop(prompts, completions, pad_id):
    from bench.task import pad_demonstrations

    rows = [(p, c + [1]) for p, c in zip(prompts, completions, strict=False)]  # every completion ends with EOS
    got, want = pad_demonstrations(rows, pad_id), old_collate(rows, pad_id)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@given(seqs=ragged, pad=st.integers(0, 3))
def test_tree_leaf_padding_equals_the_loop(seqs, pad):
    from bench.engine.tree import leaf_rows

    logps = [[-0.5 * (i + 1)] * len(s) for i, s in enumerate(seqs)]
    got = leaf_rows(seqs, logps, pad, torch.long, torch.device("cpu"))
    for a, b in zip(got, old_tree_rows(seqs, logps, pad), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


# ---- statistics: np.trapezoid and scipy's sem in place of hand-written sums ---------------------------------------
def old_trapezoid_mean(curve):
    steps = sorted(curve)
    if len(steps) < 2:
        return curve[steps[0]]
    area = sum((b - a) * (curve[a] + curve[b]) / 2 for a, b in zip(steps, steps[1:], strict=False))
    return area / (steps[-1] - steps[0])


values = st.floats(-1, 1, allow_nan=False)


@given(st.dictionaries(st.integers(0, 500), values, min_size=1, max_size=12))
def test_auc_by_np_trapezoid_equals_the_sum(curve):
    from bench.run.report.data import _trapezoid_mean

    assert float(_trapezoid_mean(curve)) == pytest.approx(old_trapezoid_mean(curve), abs=1e-12)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=8, unique=True), st.integers(1, 5))
def test_per_problem_auc_by_np_trapezoid_equals_the_sum(steps, m):
    """Per-problem curves ({step: array of M values}) average problem by problem, as before."""
    from bench.run.report.data import _trapezoid_mean

    rng = np.random.default_rng(len(steps) * 10 + m)
    curve = {s: rng.integers(0, 2, m).astype(float) for s in steps}
    np.testing.assert_allclose(_trapezoid_mean(curve), old_trapezoid_mean(curve), atol=1e-12)


@given(st.lists(values, min_size=0, max_size=10))
def test_mean_ci_and_mean_se_by_scipy_equal_the_formulas(xs):
    from scipy import stats

    from bench.run.report.data import mean_ci
    from bench.stats import mean_se

    m, half = mean_ci(xs)
    if not xs:
        assert math.isnan(m) and math.isnan(half)
        return
    assert m == pytest.approx(statistics.fmean(xs))
    if len(xs) < 2:
        assert math.isnan(half) and math.isnan(mean_se(np.array(xs)))
        return
    sd = statistics.stdev(xs)
    assert half == pytest.approx(stats.t.ppf(0.975, len(xs) - 1) * sd / math.sqrt(len(xs)), abs=1e-12)
    assert mean_se(np.array(xs)) == pytest.approx(sd / math.sqrt(len(xs)), abs=1e-12)


# ---- one JSONL reader for every task --------------------------------------------------------------------------------
def test_read_jsonl_names_the_file_and_line_of_a_bad_record(tmp_path):
    """bench.task.read_jsonl, which countdown, gsm8k, math, summarization and text_to_sql share: blank lines skipped
    (and counted in the line numbers), a line that is not JSON, not an object or lacks a required field fails naming
    the file and the line."""
    from bench.task import read_jsonl

    p = tmp_path / "d.jsonl"
    p.write_text('{"q": "a", "n": 1}\n\n{"q": "b", "n": 2}\n')
    assert read_jsonl(p, ("q",)) == [{"q": "a", "n": 1}, {"q": "b", "n": 2}]
    assert read_jsonl(p, ("n",), int) == read_jsonl(p)
    bad = [('{"q": ""}', "non-empty str fields"), ("[1]", "non-empty str"), ('{"q": ', "not a JSON line"),
           ('{"r": "b"}', "['q']")]  # fmt: skip
    for third, why in bad:
        text = '{"q": "a"}\n\n' + third + "\n"
        p.write_text(text)
        with pytest.raises(ValueError, match=rf"d\.jsonl:3: .*{re.escape(why)}"):
            read_jsonl(p, ("q",))
    p.write_text('{"n": true}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:1: expected non-empty int"):
        read_jsonl(p, ("n",), int)
