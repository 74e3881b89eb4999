"""CARD as a method like the others: its method class (method), its decoding as rows or alone (decode), the steering
of its rows in a mixed batch (steer: the Steer of serving.rows), and the teacher-forced score of a text under a row
(score).

May import: what personalize.methods may import.
"""
