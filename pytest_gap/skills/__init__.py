"""Robot skills a workflow can call: registry, perception, motion, gripper."""
