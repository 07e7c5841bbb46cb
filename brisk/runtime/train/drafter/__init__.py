"""DFlash-style drafter training (``brisk train drafter``): the recipe, its loss, its config, the
evaluation and the target-feature cache."""
