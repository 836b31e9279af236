"""Named SQL queries (one per `.sql` file: views, policies, analysis, audits), called through
sql.loader; every file has a data case in sql/cases/."""
