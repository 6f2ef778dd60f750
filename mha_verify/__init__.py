"""mha_verify: the `mha-verify` command and the pytest plugin, wiring `properties` and `export`."""

__version__ = "0.1.0"
