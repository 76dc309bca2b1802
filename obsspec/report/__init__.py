"""Reports of runs: what speculation did, as an offline HTML page, PNG plots and a Chrome trace.

    obsspec report runs/rollout            # -> runs/rollout/report/report.html

`load` reads a rollout or training run directory, `plots` draws, `page` writes the HTML,
`report.write_report` ties them together. Formats: docs/REPORT.md.
"""
