"""The paper configurations (`configs/papers/*.yaml`): `spec` holds what a file becomes (PaperSpec and its parts),
`load` reads and validates one (the JSON schema `workflow/schemas/paper.schema.yaml`, then the cross-references)."""
