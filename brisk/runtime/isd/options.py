"""How to decode: :class:`ISDOptions`, declared in :mod:`brisk.runtime.decode_options` (beside the
options every ISD decode shares with the server) so that the command line reads its fields
without importing this package."""

from __future__ import annotations

from brisk.runtime.decode_options import ISDOptions

__all__ = ["ISDOptions"]
