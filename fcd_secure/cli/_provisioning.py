"""The errors of the provisioning and site commands as the command line reports them (exit 2: bad input, named)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fcd_secure.cli.envelope import CliError


@contextmanager
def bad_input(hint: str) -> Iterator[None]:
    """Turn the provisioning layer's input errors into ``BAD_INPUT`` (exit 2) with ``hint``."""
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.engines.pki import PKIError  # noqa: PLC0415
    from fcd_secure.provisioning.consortium import ProvisioningError  # noqa: PLC0415
    from fcd_secure.federation.site_policy import SitePolicyError  # noqa: PLC0415

    try:
        yield
    except DataError as exc:
        raise CliError(str(exc), "BAD_INPUT", hint=hint, data=exc.to_dict()) from None
    except (ProvisioningError, SitePolicyError, PKIError) as exc:
        raise CliError(str(exc), "BAD_INPUT", hint=hint) from None
