"""AR pre-training of a model preset (``brisk train ar``): the recipe and its config."""
