"""The closed vocabularies of the tables (``schema.SOURCES``, ``schedule.ROLES``) are the values the code
writes: checked on a fresh estimate, on every recorded run directory and on a schedule walked step by step."""
from pathlib import Path

import pandas as pd
import torch

import perfcheck
from perfcheck.examples.models import Net
from perfcheck.measure.schedule import ROLES, StepSchedule
from perfcheck.schema import SOURCES

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_predicted_rows_source_is_one_of_schema_sources():
    pred = perfcheck.estimate(Net(), (torch.randn(2, 3, 32, 32),), system="cpu")
    assert set(pred["source"]) <= set(SOURCES)


def test_every_recorded_step_role_is_one_of_the_schedule_roles():
    files = sorted(DATA.rglob("steps.csv"))
    assert files, "no recorded steps.csv under tests/data"
    roles = set().union(*(set(pd.read_csv(f)["role"].dropna()) for f in files))
    assert roles and roles <= set(ROLES), sorted(roles - set(ROLES))


def test_a_schedule_walked_step_by_step_plays_only_the_listed_roles():
    schedule = StepSchedule(warmup=2, steps=4, count_flops=True, profile_window=(0, 1, 2), overhead_pairs=2)
    seen, measured, bare, last = [], 0, 0, None
    for index in range(20):
        role = schedule.role(index, measured, bare, last)
        seen.append(role)
        measured += role == "measured"
        bare += role == "bare"
        last = role if role in ("measured", "bare") else last
    assert set(seen) <= set(ROLES), seen
    assert {"warmup", "flops", "profile", "measured", "bare", "done"} <= set(seen), seen  # every role is reachable
