"""The privacy layer's errors: a budget that would be overspent, a ledger that cannot be trusted, a ledger rolled back.

Torch- and Opacus-free, so that the audit layer and the command line can name them without importing an accountant.
"""

from __future__ import annotations
from fcd_secure.errors import FcdError

__all__ = ["BudgetExceeded", "PrivacyLedgerError", "LedgerRollback"]


class PrivacyLedgerError(FcdError, RuntimeError):
    """The ledger file cannot be trusted (unreadable, foreign, inconsistent). Training must not go on."""


class LedgerRollback(PrivacyLedgerError):
    """A privacy ledger holds less history than the site anchored earlier: deleted, or restored from an older copy.

    Training stays refused until an operator acknowledges the reset (``fcd privacy acknowledge-reset``); the
    acknowledgement is kept in the site's anchor file and carried into the audit chain by the next upload.
    """


class BudgetExceeded(FcdError, RuntimeError):
    """A round would take the site's ε above its cap; the site refuses the round."""
