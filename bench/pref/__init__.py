"""The preference family: pairs from verifiable rewards, pair losses and their LightningModule."""
