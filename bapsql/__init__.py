"""bapsql: budget-aware agentic text-to-SQL (BAP-SQL) environments, policies, training and analysis.

Importing the package has no side effects: no database is opened, no Ray cluster is joined, no file is written.
"""

__version__ = "0.1.0"
