"""The type of every secret field: `Secret`, a SecretStr whose mask validates as unset.

A saved config.yaml writes secrets as pydantic's mask, `'**********'`; given back with `--config` (as the docs
suggest), or read by `hpctrain.load`, that mask must not become the W&B key or the Pelican token (every request
would then send `Bearer **********`). Apart from secrets.py, which the CLI imports before its signal handlers are
in: this one imports pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr

from hpctrain.config.secrets import is_masked


def unset_if_masked(value: Any) -> Any:
    return None if is_masked(value) else value


Secret = Annotated[SecretStr | None, BeforeValidator(unset_if_masked)]
