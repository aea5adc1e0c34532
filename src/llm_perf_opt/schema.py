"""The version of every JSON artifact the toolkit writes (Stage 1, Stage 2 and analytic metrics): one place."""

SCHEMA_VERSION = "1.0"
SCHEMA_MAJOR = SCHEMA_VERSION.split(".", 1)[0]
