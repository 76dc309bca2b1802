"""The regime simulator: a discrete-event model of a batch of episodes under speculation.

    obsspec simulate --grid tool.median_s=1,3,10 --grid spec.hit_rate=0.4,0.6,0.8
    obsspec simulate --from runs/rollout --grid spec.hit_rate=0,0.5,1

`config` (what it is told), `engine` (the shared policy engine), `episodes` (the event loop),
`workload` (synthetic or recorded turns), `simulate` (grids, regimes, JSON), `plot`.
See docs/REPORT.md.
"""
