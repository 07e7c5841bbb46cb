"""Risk–reward proposal training (``brisk train proposal``): the recipe, its config, its data and
the acceptance it measures."""
