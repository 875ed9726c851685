"""Workload generator: a client that drives the routers with YCSB core
workloads and measures them.

Reads:   its own inbox
Writes:  <cluster>.router.requests
"""
