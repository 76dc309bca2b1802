"""Stale reports regenerated; fresh ones untouched, their modification times as the image had them."""

import datetime
import os

FRESH = {"north": "2025-03-02 10:00", "east": "2025-04-02 10:00"}


def mtime(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=datetime.timezone.utc).timestamp()


def test_stale_reports_were_regenerated():
    assert open("/app/reports/south.txt").read() == "total=13\n"
    assert open("/app/reports/west.txt").read() == "total=4\n"
    for name in ("south", "west"):
        assert os.stat(f"/app/reports/{name}.txt").st_mtime > os.stat(f"/app/data/{name}.csv").st_mtime


def test_fresh_reports_are_untouched():
    assert open("/app/reports/north.txt").read() == "total=30\n"
    assert open("/app/reports/east.txt").read() == "total=100\n"
    for name, when in FRESH.items():
        assert os.stat(f"/app/reports/{name}.txt").st_mtime == mtime(when), name
