//! Empty: the models are in `tests/` and build only with `--cfg slidegate_loom`.
