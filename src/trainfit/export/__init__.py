"""Writers of configuration files that the real tools load."""
