"""analytic."""
