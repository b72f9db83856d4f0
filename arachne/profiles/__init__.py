"""Measured per-layer profiles: the format, the Sailor importer, and lookup for the cost model."""

from arachne.profiles.format import (
    LayerTimes,
    ProfileDB,
    ProfileEntry,
    ProfileSet,
    default_profile_db,
    merged_profile_db,
)

__all__ = ["LayerTimes", "ProfileDB", "ProfileEntry", "ProfileSet", "default_profile_db", "merged_profile_db"]
