"""Cloud: the flavor catalog, ranking of flavors for a plan, and spot (interruption) pricing."""
