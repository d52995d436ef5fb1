"""Data ingestion: Alpaca-schema instruction data, PKU-SafeRLHF-schema preference pairs and
calibration/test prompt splits, from a hub dataset id or a local file through one code path."""
