"""Moved to trainfit.config.run_config; this name stays for the runner's imports."""
from trainfit.config.run_config import *  # noqa: F401,F403
