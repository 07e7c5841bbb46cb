"""``python -m brisk.cli`` (what ``torchrun -m brisk.cli`` runs)."""

from __future__ import annotations

import sys

from brisk.cli import main

sys.exit(main())
