"""Repository scripts; locked_wheels is imported by scripts/wheels (beside it) and by the tests
(`from scripts import locked_wheels`)."""
