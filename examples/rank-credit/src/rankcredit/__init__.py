"""rankcredit: an example of a creditlab method defined in its own package (docs/add-a-method.md)."""
