"""Moved to trainfit.versions (read by export/, hardware/ and train/ alike); this name stays for the runner's import."""
from trainfit.versions import *  # noqa: F401,F403
