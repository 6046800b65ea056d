"""The `saturation` study: where one initiator core and one target core stop scaling (table 6.1)."""

from __future__ import annotations

from .plateau import find_plateau, plateau_confirmed

__all__ = ["find_plateau", "plateau_confirmed"]
