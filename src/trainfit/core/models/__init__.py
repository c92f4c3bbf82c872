"""Models: ModelSpec and its capabilities, the family loaders (Hub config.json -> spec), the catalog,
shapes, parameter counts and the meta-device count."""
