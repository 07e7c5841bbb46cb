"""The prefix-conditioned corrector (``brisk train corrector``): the recipe, its config, the events
it trains on and their store."""
