"""The report the summary tool makes, and the files the Dockerfile's heredocs wrote."""

from pathlib import Path


def test_report_totals_per_category():
    assert Path("/app/report.txt").read_text() == "garden\t5\npaint\t12\ntools\t7\n"


def test_the_heredocs_were_written_as_buildkit_writes_them():
    assert Path("/app/settings.ini").read_text() == "[app]\nenv = production\ncurrency = $\n"
    assert Path("/app/inventory.csv").read_text().splitlines()[4] == "C-3,garden,$5"
    assert Path("/app/tools/summarize.sh").read_text().startswith("#!/bin/sh\n# totals")
    assert Path("/app/BUILD").read_text() == "built for production\n"
    assert Path("/app/README.txt").read_text() == "Inventory tools. Totals: tools/summarize.sh\n"
