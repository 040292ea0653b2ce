"""CI policy over summary.json: gates, rules, diff and run history."""
