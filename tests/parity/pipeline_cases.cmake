# Parity of `mpt pipeline` with PyTorch-Python: exact split (2, 3, 4 stages) and the
# microbatched gradients of the sweep (see tests/parity/pipeline_ref.py).
parity_case(pipeline_default pipeline_ref.py pipeline --set cost.forward_us=50)
parity_case(pipeline_split3 pipeline_ref.py pipeline --config configs/pipeline_split3.json --set cost.forward_us=50)
parity_case(pipeline_seed7 pipeline_ref.py pipeline --seed 7 --set cost.forward_us=50 --set "split.widths=[5,32,32,32,32,2]" --set "split.cuts=[1,4]")
# One process per stage: the same sweep rows (gradients, losses) as PyTorch-Python's microbatch loop.
parity_case(pipeline_processes pipeline_ref.py pipeline --set executor=processes --set pipeline.stages=2 --nproc 2
            --set cost.forward_us=50 --set "pipeline.microbatches=[1,2,4]" --set pipeline.steps=1)
# Interleaved 1F1B: the sweep's gradients are PyTorch's microbatch loop's, bit for bit.
parity_case(pipeline_interleaved pipeline_ref.py pipeline --config configs/pipeline_interleaved.json --set cost.forward_us=50)
# ZB-V (2 chunks per rank in a V): the programs are torch's ScheduleZBVZeroBubble's, the gradients PyTorch's loop's.
parity_case(pipeline_zbv pipeline_ref.py pipeline --config configs/pipeline_zbv.json --set cost.forward_us=50
            --set "pipeline.microbatches=[4,8]" --set pipeline.steps=1 --set sync.enabled=false)
