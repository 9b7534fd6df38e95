"""The performance model: GPU ceilings with sources, a calibrated model of the indexer's
decode step (`indexer.predict`), its calibration against this project's H200 data and
published SM100 times, and a model of a whole DeepSeek-V3.2 decode step (`decode_step`).
Everything it returns is modeled, and says so."""
