"""The machine a benchmark ran on, printed beside its figures (one definition for every script here)."""

from __future__ import annotations

import os
import platform
import sys


def machine() -> dict:
    """CPU, core count, library versions, torch's thread count and the command line."""
    import flwr
    import numpy as np
    import torch

    return {
        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "flwr": flwr.__version__, "numpy": np.__version__, "threads": torch.get_num_threads(),
        "argv": " ".join(sys.argv),
    }
