"""dsprof.profiler"""
