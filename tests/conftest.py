"""Hypothesis profiles: ``ci`` (under ``CI``, which ``.ci/run`` sets) draws its examples
deterministically, so a CI run is repeatable; elsewhere every run draws new ones."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
