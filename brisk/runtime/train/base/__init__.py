"""I-DLM training of a base model (``brisk train base``): the recipe and its config."""
