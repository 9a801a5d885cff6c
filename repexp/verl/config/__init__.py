"""Hydra config of `python -m repexp.verl.train` (a package so Hydra can find it as pkg://repexp.verl.config)."""
