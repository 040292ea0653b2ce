"""dsprof.analysis.outputs"""
