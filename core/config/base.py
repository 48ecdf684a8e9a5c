"""The config's base: its error and the model every section and table entry is."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(Exception):
    """The config file cannot be used; the message names the key and the problem."""


class Section(BaseModel):
    # Every number has finite bounds (inf and nan are refused everywhere), every text a length limit:
    # a value the config accepts never overflows a date, a timeout or a prompt (tests/core/test_config.py
    # walks the fields).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
