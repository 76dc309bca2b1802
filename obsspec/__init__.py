"""obsspec: lossless observation speculation for agentic RL on terminal tasks.

See README.md for the commands and docs/ROLLOUT.md for the method.
"""

__version__ = "0.1.0"
