"""The analysis stages (one module per analysis), their runner and the tables they hand on."""
