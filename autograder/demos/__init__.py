"""What the notebooks run on screen: notebook 05's demo writer, 07's gloo jobs, 09's sharded jobs, 10's
token streams, one checkpoint as two releases wrote it (09), and the live controls of the classroom demos."""
