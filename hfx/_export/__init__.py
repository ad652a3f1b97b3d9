"""Export: the flat signature, the torch shape translation, torch.export and the passes on its program."""
