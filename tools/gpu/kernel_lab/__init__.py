"""The kernel lab's GPU side (staged flat with runner.py and its siblings by tools/lab/matrix.py:
gpu.LAB). lab.py runs every kernel task's strategies over its matrix, and ncu on the best;
lab_step.py is its decode row for a step task. lab.py loads runner.py, ncu.py and lab_step.py
by path from beside itself, so it runs only from a flat copy (gpu.copy_flat(dest, gpu.LAB)): the
lab's stage, or the one a test or benchmark makes. Dev side: what it measures is never a
verdict.
"""
