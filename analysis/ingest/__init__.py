"""dsprof.analysis.ingest"""
