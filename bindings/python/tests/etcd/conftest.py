"""The etcd executor's tests: one real 3-member etcd cluster shared by the session (the
``etcd_cluster`` fixture of tests/conftest.py)."""
