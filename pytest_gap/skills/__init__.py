"""Robot skills a workflow can call: the registry and catalogue, perception, motion, gripper,
packing, and run_policy (a learned policy as one skill).

Its one job is to act on an env through the `SkillContext`; knows nothing of workflows,
benchmarks or pytest.
"""
