# %% [markdown]
# # 08 · Fused kernels in Triton
#
# Notebook 07 looked at fusion from the outside: `torch.compile` generated one kernel for a chain of ops, and the
# profiler counted the launches. Here you write the fused kernels yourself, in [Triton](https://triton-lang.org),
# the Python-embedded language that `torch.compile` itself emits for GPUs, and count what each kernel saves.
#
# **Objectives**
# - Triton's programming model on the smallest useful kernel: programs and the grid, blocks, masks, pointer
#   arithmetic, `tl.load` / `tl.store`;
# - write fused kernels for bias + GELU, a row softmax and a LayerNorm forward, and read an AdamW update written as
#   one kernel; check each against torch in fp32 and with bf16 inputs (fp32 arithmetic inside), within a stated
#   tolerance;
# - count the bytes each kernel reads and writes against the unfused sequence of torch ops, and place both on
#   notebook 07's roofline;
# - (stretch) FlashAttention's forward pass: a tiled kernel with an online softmax that never stores the N × N
#   score matrix;
# - know where Triton's CPU interpreter is not the hardware, and why tests of low-precision kernels need the real
#   device.
#
# **Prerequisites:** notebook 07 (fusion, bytes moved, the roofline), notebook 05 (bf16, TF32).
#
# **Estimated time:** 105 min (core 70 min, stretch 35 min)
#
# **Where it runs.** On a CUDA GPU the kernels are compiled and timed. Everywhere else they run in Triton's
# *interpreter* (`TRITON_INTERPRET=1`), which executes each program of a kernel as NumPy code on the CPU, one after
# another: the answers are real, the timings are not. Which of the two ran is decided by the device gate
# (`labkit.device`), below, and printed. The notebook needs the `triton` package (`pip install -e '.[kernels]'`);
# without it, the first cell says how to install it.

# %% [markdown] lang="zh" en="782c259e9313"
# # 08 · 用 Triton 编写融合内核
#
# notebook 07 从外部观察了算子融合：`torch.compile` 为一串算子生成了一个内核，性能分析器数出了内核启动的次数。这
# 里你要亲手编写融合内核，使用的语言是 [Triton](https://triton-lang.org)：一种嵌入在 Python 中的语
# 言，`torch.compile` 在 GPU 上生成的正是它。你还要统计每个内核省下了多少。
#
# **学习目标**
# - 在最小的实用内核上掌握 Triton 的编程模型：程序实例（program）与网格（grid）、块（block）、掩码、指针运算、
#   `tl.load` / `tl.store`；
# - 为 bias + GELU、按行 softmax 和 LayerNorm 前向编写融合内核，并读懂一个写成单个内核的 AdamW 更新；分别在 fp32
#   和 bf16 输入（内部以 fp32 计算）下，把每个内核与 torch 对照检查，误差须在明确给出的容差以内；
# - 统计每个内核读写的字节数，与未融合的 torch 算子序列对比，并把两者都画到 notebook 07 的屋顶线图上；
# - （进阶）FlashAttention 的前向传播：一个分块（tiled）内核，采用在线 softmax，从不存储 N × N 的分数矩阵；
# - 了解 Triton 的 CPU 解释器在哪些方面与硬件不同，以及为什么低精度内核的测试离不开真实设备。
#
# **前置知识：** notebook 07（算子融合、搬运的字节数、屋顶线模型），notebook 05（bf16、TF32）。
#
# **预计用时：** 105 分钟（核心部分 70 分钟，进阶部分 35 分钟）
#
# **在哪里运行。** 在 CUDA GPU 上，内核会被编译并计时。在其他任何地方，内核都在 Triton 的*解释器*
# （`TRITON_INTERPRET=1`）中运行：解释器在 CPU 上把内核的每个程序实例当作 NumPy 代码，一个接一个地执行。结果是
# 真实的，计时则不是。具体走哪一种，由下面的设备门控（`labkit.device`）决定，并打印出来。本 notebook 需要 `triton`
# 包（`pip install -e '.[kernels]'`）；如果没有安装，第一个单元格会告诉你如何安装。

# %%
# %matplotlib inline
# %load_ext labkit
from labkit import device, kernels

MODE = kernels.setup()  # asks the device gate; on a CPU it sets TRITON_INTERPRET=1 *before* triton is imported
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import bench
from labkit import kernelbench as KB
from labkit import roofline as R
from labkit import traffic as T
from labkit.check import check, predict, reveal

torch.set_num_threads(1)  # steadier timings on a shared machine (raise it on your own node)
K = kernels.load()  # labkit's reference kernels, decorated in the mode chosen above
dev = MODE.device
print(MODE)
if MODE.interpreted:
    print(f"Triton {triton.__version__}: section 4's findings about the interpreter's numerics are this version's")

# %% [markdown]
# ## 1. Triton's programming model
#
# A Triton kernel is a Python function decorated with `@triton.jit`. You launch it on a **grid** of **programs**;
# every program runs the same code and asks `tl.program_id(axis)` which one it is (CUDA would say: a grid of thread
# blocks). A program works on whole **blocks** of values: `tl.arange(0, BLOCK)` is a vector of `BLOCK` indices, and
# `BLOCK` is a compile-time constant (`tl.constexpr`, a power of two). Pointers are numbers: `x_ptr + offs` is a
# block of addresses, `tl.load` reads them and `tl.store` writes them. How a block maps onto the GPU's threads,
# registers and shared memory is the compiler's job: you think in blocks, not in threads.
#
# The smallest useful kernel, `out = x + y`:

# %% [markdown] lang="zh" en="76bde32e847d"
# ## 1. Triton 的编程模型
#
# Triton 内核是一个用 `@triton.jit` 装饰的 Python 函数。你在一个由若干**程序实例**（program）组成的**网
# 格**（grid）上启动它；每个程序实例运行同样的代码，并通过 `tl.program_id(axis)` 得知自己是第几个（用 CUDA 的话
# 说：由线程块组成的网格）。一个程序实例处理的是整**块**（block）的数值：`tl.arange(0, BLOCK)` 是由 `BLOCK` 个下
# 标组成的向量，而 `BLOCK` 是编译期常量（`tl.constexpr`，必须是 2 的幂）。指针就是数：`x_ptr + offs` 是一块地
# 址，`tl.load` 读取这些地址，`tl.store` 写入这些地址。一个块如何映射到 GPU 的线程、寄存器和共享内存，是编译器的
# 事：你以块为单位思考，而不是以线程为单位。
#
# 最小的实用内核，`out = x + y`：

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)  # which program am I?
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # the BLOCK elements this program owns
    mask = offs < n  # the last program runs past the end: switch those lanes off
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


# %% [markdown]
# Launching it: the grid is a tuple with the number of programs per axis, the tensors are passed as pointers to
# their first element, and constexprs by keyword. 1000 elements in blocks of 256 need `cdiv(1000, 256) = 4`
# programs, and the last one has 24 lanes too many:

# %% [markdown] lang="zh" en="25d93d6ac1c2"
# 启动它：网格是一个元组，给出每个轴上的程序实例数；张量以指向其首元素的指针传入，constexpr 参数以关键字传入。
# 1000 个元素按 256 个一块，需要 `cdiv(1000, 256) = 4` 个程序实例，最后一个多出 24 个通道（lane）：

# %%
n, BLOCK = 1000, 256
x, y = kernels.randn(n, seed=1), kernels.randn(n, seed=2)
out = torch.empty_like(x)
grid = (triton.cdiv(n, BLOCK),)
add_kernel[grid](x, y, out, n, BLOCK=BLOCK)
assert torch.equal(out, x + y)
print(f"grid = {grid}: {grid[0]} programs x {BLOCK} lanes = {grid[0] * BLOCK} slots for {n} elements; out == x + y")

# %% [markdown]
# Which program wrote which element? A kernel that stores its own program id says so:

# %% [markdown] lang="zh" en="f7852f8dc0e9"
# 哪个程序实例写了哪个元素？让内核把自己的程序实例编号存进去，一看便知：

# %%
@triton.jit
def owner_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.program_id(0), mask=offs < n)


owner = torch.full((n,), -1, dtype=torch.int32, device=dev)
owner_kernel[grid](owner, n, BLOCK=BLOCK)
per_program = torch.bincount(owner.long().cpu()).tolist()
print(f"elements per program: {per_program}")
assert per_program == [256, 256, 256, 232] and (owner >= 0).all()

# %% [markdown]
# Without the mask, program 3 would read 24 values past the end of `x` and write 24 values past the end of `out`:
# on a GPU an illegal memory access (if you are lucky) or silent corruption of a neighbouring tensor. The exercise
# graders below catch exactly that.
#
# **Offsets in int64.** `tl.program_id` is an int32, and so is an integer argument like `row_stride` or `n` below
# 2³¹: their product is computed in int32. A (70 000, 40 000) fp32 activation has 2.8 × 10⁹ elements, and the
# offset of its last row, `row * row_stride`, no longer fits:

# %% [markdown] lang="zh" en="a77c99924311"
# 如果没有掩码，程序实例 3 会越过 `x` 的末尾多读 24 个值，并越过 `out` 的末尾多写 24 个值：在 GPU 上，这要么是非
# 法访存（illegal memory access，如果你运气好），要么会悄无声息地破坏相邻的张量。下面各练习的检查程序专门捕捉这
# 种错误。
#
# **偏移量用 int64。** `tl.program_id` 是 int32，小于 2³¹ 的整数参数（如 `row_stride` 或 `n`）也是 int32：
# 它们的乘积按 int32 计算。一个 (70 000, 40 000) 的 fp32 激活值有 2.8 × 10⁹ 个元素，其最后一行的偏移量
# `row * row_stride` 已经放不下了：

# %%
row, row_stride = torch.tensor(69_999, dtype=torch.int32), 40_000
print(f"int32: {int(row * row_stride):,}   int64: {int(row.long() * row_stride):,}")
assert int(row * row_stride) < 0 < int(row.long() * row_stride)

# %% [markdown]
# The wrapped offset points before the tensor: silent garbage, or an illegal address. labkit's kernels therefore
# write `tl.program_id(0).to(tl.int64)` (or cast the base offset) before multiplying, and so do the solutions below;
# the cost is 64-bit integer arithmetic for the offsets and a few more registers to hold them, usually nothing next
# to the loads.
#
# Around every kernel sits a **launcher**, a plain Python function that checks the inputs, allocates the output,
# chooses the block and the grid, and launches. labkit's softmax launcher, whole:

# %% [markdown] lang="zh" en="2537bc94028e"
# 回绕后的偏移量指向张量之前的位置：要么悄无声息地读到垃圾数据，要么访问非法地址。因此，labkit 的内核在做乘法
# 之前先写 `tl.program_id(0).to(tl.int64)`（或者把基址偏移量转换为 int64），下面的参考答案也是如此；代价是偏移量
# 要用 64 位整数运算，还要多占几个寄存器来存放它们，与加载操作相比通常可以忽略不计。
#
# 每个内核外面都包着一个**启动函数**（launcher）：一个普通的 Python 函数，负责检查输入、分配输出、选择块大小和
# 网格，然后启动内核。下面是 labkit 的 softmax 启动函数的完整代码：

# %%
print(kernels.source(kernels.softmax))

# %% [markdown]
# ## 2. Fused kernels
#
# A fused kernel does in one pass through memory what a chain of torch ops does in several: each op of the chain
# reads its inputs from memory and writes its result back, while the fused kernel keeps the intermediates in
# registers. Every kernel here follows the mixed-precision rule: **load, convert to fp32, compute, convert back only
# when storing.** With bf16 tensors that gives bf16 traffic and fp32 arithmetic.
#
# The patterns worth fusing are the ones this section writes: a linear layer's epilogue (bias + activation), the
# normalisations (softmax, LayerNorm), the optimizer's elementwise update, and attention (section 3).
#
# Writing ops on one line does not fuse them. A module whose `forward` returns `F.relu(self.linear(x))` still runs
# two kernels in eager PyTorch, one per op, as the dispatcher sees them:

# %% [markdown] lang="zh" en="5a6aafe33107"
# ## 2. 融合内核
#
# 一串 torch 算子要在内存中走好几遍才能完成的工作，融合内核只走一遍就能完成：串中的每个算子都从内存读取输入、
# 再把结果写回内存，而融合内核把中间结果留在寄存器里。这里的每个内核都遵循混合精度的规则：**加载，转换为 fp32，
# 计算，只在存储时再转换回去。** 对 bf16 张量来说，这意味着访存按 bf16 进行，算术按 fp32 进行。
#
# 值得融合的模式，就是本节要写的这几种：线性层的尾处理（epilogue，即 bias + 激活函数）、归一化（softmax、
# LayerNorm）、优化器的逐元素更新，以及注意力（第 3 节）。
#
# 把几个算子写在同一行里并不会融合它们。一个 `forward` 返回 `F.relu(self.linear(x))` 的模块，在 eager 模式的
# PyTorch 中仍然运行两个内核，每个算子一个；下面列出的就是分发器（dispatcher）看到的算子：

# %%
lin = torch.nn.Linear(64, 64).to(dev)
eager = T.torch_traffic(lambda inp: F.relu(lin(inp)), torch.ones(8, 64, device=dev))
print(f"F.relu(linear(x)): {eager.launches} ops, {[o.op for o in eager.ops]}")
assert eager.launches == 2

# %% [markdown]
# Fusion takes a compiler (`torch.compile`, XLA, TensorRT) or a kernel you write.
#
# ### 2.1 bias + GELU
#
# A transformer MLP computes `gelu(x @ W + b)`. After the matmul, eager torch runs `x + b` and `gelu` as two
# kernels: the sum goes to memory and comes back. The fused kernel reads `x` and `b` and writes `y` once.
# (`torch.compile` fuses the two the same way; on a GPU it emits a Triton kernel much like yours.)
#
# **08.bias-gelu.** Write the kernel's body: one program per `BLOCK` elements of the flattened `(rows, n_cols)`
# tensor (as `add_kernel`), the bias of each element's column (element `i` is in column `i % n_cols`), the exact
# GELU `gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))` with `tl.math.erf`, and the store in `y`'s dtype
# (`y_ptr.dtype.element_ty`).

# %% [markdown] lang="zh" en="44b94c467618"
# 融合需要编译器（`torch.compile`、XLA、TensorRT），或者一个你自己写的内核。
#
# ### 2.1 bias + GELU
#
# Transformer 的 MLP 计算 `gelu(x @ W + b)`。矩阵乘法之后，eager 模式的 torch 用两个内核分别运行 `x + b` 和
# `gelu`：两者之和先写入内存，再被读回来。融合内核读取 `x` 和 `b`，只写一次 `y`。（`torch.compile` 也是这样融合
# 这两个算子的；在 GPU 上，它生成的 Triton 内核和你写的很像。）
#
# **08.bias-gelu.** 编写内核主体：把 `(rows, n_cols)` 张量展平，每 `BLOCK` 个元素对应一个程序实例（与
# `add_kernel` 相同）；每个元素取其所在列的 bias（元素 `i` 位于第 `i % n_cols` 列）；用 `tl.math.erf` 计算精确的
# GELU `gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))`；按 `y` 的数据类型（`y_ptr.dtype.element_ty`）存储。

# %%
@triton.jit
def my_bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ...  # offsets and mask; load x and its column's bias, convert to fp32; gelu(x + b); store in y's dtype
    ### BEGIN SOLUTION
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    h = x + b
    tl.store(y_ptr + offs, (0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))).to(y_ptr.dtype.element_ty),
             mask=mask)
    ### END SOLUTION


check("08.bias-gelu", my_bias_gelu_kernel)

# %% [markdown]
# The grader launched your kernel on three problems (on a CPU, in Triton's interpreter; on a GPU, compiled): a size that fills whole blocks, one
# that needs the mask (its output sits in a larger buffer, so a write past the end is seen), and bf16 inputs.
#
# ### 2.2 Row softmax
#
# `softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m)` for any `m`; with `m` the row's max, every exponent is at most
# 0 and nothing overflows (fp32 `exp` overflows to inf above 88.7, and inf / inf is NaN). Eager torch written out
# takes five ops:

# %% [markdown] lang="zh" en="fc4e5bf889f9"
# 检查程序用三组输入启动了你的内核（在 CPU 上用 Triton 的解释器运行，在 GPU 上则编译后运行）：一个正好填满整块的
# 规模；一个需要掩码的规模（其输出位于一个更大的缓冲区中，因此越界写入会被发现）；以及 bf16 输入。
#
# ### 2.2 按行 softmax
#
# 对任意 `m`，都有 `softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m)`；取 `m` 为该行的最大值，每个指数都不大于 0，
# 因此不会发生上溢（fp32 的 `exp` 在 88.7 以上上溢为 inf，而 inf / inf 是 NaN）。用 eager torch 逐步写出来，需要
# 五个算子：

# %%
print(kernels.source(kernels.softmax_unfused))

# %% [markdown]
# **08.softmax.** One program per row, the whole row in one block (`BLOCK` is the next power of two of `n_cols`,
# see the launcher above; consecutive rows are `row_stride` elements apart). Lanes past the end of the row must
# not win the max nor add to the sum: load them as `-inf` (a 0 would win the max of a row whose values all lie
# below -104, and every exponential of that row would underflow to 0, as fp32 `exp` does below -104; the grader tries
# such a row).
#
# One block per row has a limit: the row lives in registers, spread over the program's threads. With 16 warps
# (512 threads) a row of 16 384 fp32 values costs 32 registers per thread for each live copy (`x`, then its
# exponentials); a row of 65 536 would cost 128 per copy, and a thread has at most 255, so the compiler would spill
# to slow local memory. The launcher refuses such rows; notebook 16 loops over them instead:

# %% [markdown] lang="zh" en="c3f04c7cb7c5"
# **08.softmax.** 每行一个程序实例，整行放在一个块中（`BLOCK` 是不小于 `n_cols` 的最小的 2 的幂，见上面的启动函
# 数；相邻两行相距 `row_stride` 个元素）。越过行尾的通道既不能成为最大值，也不能计入总和：把它们加载为
# `-inf`（如果加载为 0，对于一个所有值都低于 -104 的行，0 会成为最大值，于是该行的每个指数都会下溢为 0，因为
# fp32 的 `exp` 在 -104 以下就下溢为 0；检查程序会测试这样的行）。
#
# 每行一个块有一个限制：整行都保存在寄存器里，分散在程序实例的各个线程中。使用 16 个 warp（512 个线程）时，
# 一行 16 384 个 fp32 值，每份活跃副本（先是 `x`，然后是它的指数）要占每个线程 32 个寄存器；一行 65 536 个值，
# 每份副本就要占 128 个，而一个线程最多只有 255 个寄存器，于是编译器会把数据溢出到缓慢的本地内存。启动函数会拒绝
# 这样的行；notebook 16 改用循环来处理它们：

# %%
try:
    kernels.softmax(torch.zeros(1, kernels.MAX_ROW_BLOCK + 1))
except ValueError as err:
    print(f"ValueError: {err}")

# %%
@triton.jit
def my_softmax_kernel(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ...  # load the row (masked, -inf past the end) in fp32; subtract its max; exp; divide by the sum; store
    ### BEGIN SOLUTION
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * row_stride + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


check("08.softmax", my_softmax_kernel)

# %% [markdown]
# ### 2.3 LayerNorm forward
#
# `y = (x - mean) / sqrt(var + eps) * w + b` over each row. Written op by op it takes nine kernels
# (`kernels.layernorm_unfused`); `F.layer_norm` is one hand-written fused kernel, and so is yours. A real forward
# kernel also stores each row's mean and `rstd = 1 / sqrt(var + eps)`: the backward pass needs them
# (`torch.ops.aten.native_layer_norm` returns the same three tensors).
#
# **08.layernorm.** Mind the masked lanes: they must count neither in the mean nor in the variance. Mind the
# dtype: with bf16 inputs, sums in bf16 lose digits (a sum of 50 values near 8 needs more than bf16's 8 bits).
# And mind the variance: the grader tries a constant row (variance 0, where `eps` is all that keeps `rstd` finite)
# and rows of 1000 + 10⁻³·N(0, 1), where the one-pass formula E[x²] − E[x]² subtracts two numbers near 10⁶ that
# agree in every digit fp32 keeps. Centre the row first, then square.

# %% [markdown] lang="zh" en="8d50877e86b4"
# ### 2.3 LayerNorm 前向
#
# 对每一行计算 `y = (x - mean) / sqrt(var + eps) * w + b`。逐个算子地写，需要九个内核
# （`kernels.layernorm_unfused`）；`F.layer_norm` 是一个手写的融合内核，你写的也是。真正的前向内核还要存储每一行
# 的均值和 `rstd = 1 / sqrt(var + eps)`：反向传播需要它们（`torch.ops.aten.native_layer_norm` 返回的正是这三个
# 张量）。
#
# **08.layernorm.** 注意被掩码的通道：它们既不能计入均值，也不能计入方差。注意数据类型：输入为 bf16 时，用 bf16
# 求和会丢失有效数字（50 个接近 8 的值之和，所需的位数超过 bf16 的 8 位有效位）。还要注意方差：检查程序会测试
# 常数行（方差为 0，此时只有 `eps` 能让 `rstd` 保持有限），以及由 1000 + 10⁻³·N(0, 1) 组成的行；对这样的行，
# 单遍公式 E[x²] − E[x]² 要把两个接近 10⁶ 的数相减，而它们在 fp32 保留的每一位上都相同。先把行中心化，再求平方。

# %%
@triton.jit
def my_layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ...  # load x (fp32); mean; x - mean (0 on masked lanes); var; rstd; y = xc * rstd * w + b; store y, mean, rstd
    ### BEGIN SOLUTION
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    ### END SOLUTION


check("08.layernorm", my_layernorm_kernel)

# %% [markdown]
# ### 2.4 The AdamW update as one kernel
#
# `torch.optim.AdamW` with `foreach=False` updates each parameter with about ten ops (decay, two moment updates, a
# square root, a division, ...), each a pass over the parameter-sized tensors. The whole update is elementwise, so
# one kernel can read `p, g, m, v` once and write `p, m, v` once. It is what PyTorch's `fused=True` and DeepSpeed's
# FusedAdam do. The gradient may arrive in bf16 (read as 2 bytes, converted in registers), while the master weights
# and the moments stay fp32 (notebook 06). labkit's kernel, whole:

# %% [markdown] lang="zh" en="d9263b66fed5"
# ### 2.4 用一个内核完成 AdamW 更新
#
# `torch.optim.AdamW` 在 `foreach=False` 时，更新每个参数大约要用十个算子（权重衰减、两个动量的更新、一次平方根、
# 一次除法……），每个算子都要把与参数同样大小的张量过一遍。整个更新是逐元素的，所以一个内核就可以把 `p, g, m, v`
# 各读一次，把 `p, m, v` 各写一次。PyTorch 的 `fused=True` 和 DeepSpeed 的 FusedAdam 做的正是这件事。梯度可以以
# bf16 传入（按 2 字节读取，在寄存器中转换），而主权重和动量保持 fp32（notebook 06）。labkit 的内核，完整代码
# 如下：

# %%
print(kernels.source(K.adamw_kernel))

# %% [markdown]
# ### 2.5 Every kernel against torch
#
# Each reference kernel on fresh inputs with 300 columns (not a power of two, so the masks matter), compared with
# torch's own op computed in float64 on the same values (bf16 inputs are upcast exactly). The tolerance, stated
# (`kernels.tolerance`): **fp32 outputs within `1e-5 * |ref| + 1e-6`**, a few fp32 roundings, since a kernel sums in
# another order than torch; **bf16 outputs within one bf16 ulp (`2**-7 * |ref|`)** more, the single rounding when
# the kernel stores. The yardstick is float64, not torch's fp32 op: both make fp32 rounding errors of their own.
# (In the interpreter the kernel's `tl.math.erf` is Python's float64 `math.erf`, rounded once to fp32, so here the
# kernel even lands closer to float64 than fp32 `F.gelu` does; compiled, `erf` is an fp32 library routine of a few
# ulp and neither is ahead by rule.) AdamW: `p, m, v` after one step against `torch.optim.AdamW`.

# %% [markdown] lang="zh" en="249c5af34595"
# ### 2.5 每个内核都与 torch 对照
#
# 每个参考内核都在新生成的 300 列输入上运行（300 不是 2 的幂，因此掩码会起作用），并与 torch 自带的算子在同样的
# 值上以 float64 计算的结果比较（bf16 输入可以精确地提升为 float64）。容差明确给出
# （`kernels.tolerance`）：**fp32 输出在 `1e-5 * |ref| + 1e-6` 以内**，即几次 fp32 舍入的误差，因为内核求和的顺
# 序与 torch 不同；**bf16 输出在此基础上再放宽一个 bf16 ulp（末位单位，`2**-7 * |ref|`）**，即内核存储时的那一次
# 舍入。对照基准是 float64，而不是 torch 的 fp32 算子：两者各自都有 fp32 舍入误差。（在解释器中，内核的
# `tl.math.erf` 就是 Python 的 float64 `math.erf`，只在最后舍入一次到 fp32，所以这里内核甚至比 fp32 的 `F.gelu`
# 更接近 float64；编译后，`erf` 是一个误差为几个 ulp 的 fp32 库函数，两者谁更准就没有定规了。）AdamW：把一步之后
# 的 `p, m, v` 与 `torch.optim.AdamW` 的结果比较。

# %%
checks = [KB.verify(name, 16, 300, dtype) for name in KB.NAMES for dtype in ("fp32", "bf16")]
for c in checks:
    print(f"{c.name:<10} {c.dtype:<9} vs {c.reference:<17}  rtol {c.rtol:.3g}, atol {c.atol:.0e}: "
          f"{'within' if c.ok else 'OUTSIDE'}")
assert all(c.ok for c in checks)

# %% [markdown]
# This is the discipline for any fused kernel: check it alone, against the unfused reference, in every dtype it
# will see and on sizes that exercise its masks, before trusting an end-to-end run, where a wrong kernel shows up
# only as a loss curve that is slightly off. Two more things a forward kernel does not give you: a **backward**
# (autograd cannot see inside a kernel; wrap it in a `torch.autograd.Function` whose backward uses what the forward
# saved, such as LayerNorm's mean and rstd), and **portability** (check it on each GPU generation you run on).
#
# How close, as a multiple of the tolerance (this depends on the machine's math libraries, so it is not compared):

# %% [markdown] lang="zh" en="403070c386cb"
# 这是对待任何融合内核都应遵守的规矩：在信任端到端的运行之前，先单独检查它，与未融合的参考实现对照，覆盖它会遇到
# 的每种数据类型，并使用能触发掩码的尺寸；在端到端的运行中，一个错误的内核只会表现为一条略有偏差的损失曲线。
# 前向内核还缺两样东西：**反向传播**（autograd 看不到内核内部；要把它包进一个 `torch.autograd.Function`，其
# backward 使用前向保存下来的量，例如 LayerNorm 的 mean 和 rstd），以及**可移植性**（在你要运行的每一代 GPU 上
# 都检查一遍）。
#
# 各内核的最大误差是容差的多少倍（这取决于机器的数学库，因此测试不比对这一输出）：

# %%
# NBVAL_IGNORE_OUTPUT
print("  ".join(f"{c.name} {c.dtype}: {c.worst:.2f}" for c in checks))

# %% [markdown]
# ### 2.6 Bytes: the unfused torch sequence against the fused kernel
#
# Fusion is about bytes. `T.torch_traffic` runs a torch function under a `TorchDispatchMode` that sees every ATen
# op, and adds up, per op, the bytes of the distinct tensors it reads and the tensors it writes (views move
# nothing; in-place ops read and write). For the five-op softmax of a 64 × 1000 fp32 matrix (256 000 bytes):

# %% [markdown] lang="zh" en="754a8bf262db"
# ### 2.6 字节数：未融合的 torch 序列与融合内核对比
#
# 融合关乎的是字节数。`T.torch_traffic` 在一个能看到每个 ATen 算子的 `TorchDispatchMode` 下运行 torch 函数，
# 按算子累加它读取的各个不同张量的字节数和它写入的张量的字节数（视图不搬运任何数据；原地算子既读又写）。对一个
# 64 × 1000 的 fp32 矩阵（256 000 字节）做五个算子的 softmax：

# %%
x = KB.make_inputs("softmax", 64, 1000)["x"]
unfused = T.torch_traffic(kernels.softmax_unfused, x)
for op in unfused.ops:
    print(f"{op.op:<18} reads {op.read:>8,} B, writes {op.written:>8,} B")
print(f"{unfused.launches} launches, {unfused.total:,} bytes in all")

# %% [markdown]
# **08.softmax-bytes (predict, then run).** How many times more bytes does this five-op sequence move than the fused
# kernel, which reads the matrix once and writes it once? Write a number, then run the next cell.

# %% [markdown] lang="zh" en="b0b205015829"
# **08.softmax-bytes（先预测，再运行）。** 这个五算子序列搬运的字节数，是融合内核（把矩阵读一次、写一次）的多少
# 倍？写下一个数，然后运行下一个单元格。

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 4
### END SOLUTION
predict("08.softmax-bytes", prediction)

# %% [markdown]
# The kernel's side is counted in the interpreter: `T.triton_traffic` watches every `tl.load` and `tl.store` of a
# launch and counts each distinct byte once. (A compiled kernel cannot be watched from Python; on a GPU the cell
# uses the model, `T.fused_traffic`, which the interpreter's count matches: see the next cells.)

# %% [markdown] lang="zh" en="6047c50b094f"
# 内核一侧的字节数在解释器中统计：`T.triton_traffic` 监视一次启动中的每个 `tl.load` 和 `tl.store`，每个不同的
# 字节只计一次。（编译后的内核无法从 Python 中监视；在 GPU 上，这个单元格使用字节数模型 `T.fused_traffic`，
# 解释器的计数与这个模型完全一致：见后面的单元格。）

# %%
fused = T.triton_traffic(kernels.softmax, x) if MODE.interpreted else T.fused_traffic("softmax", 64, 1000)
print(f"fused softmax: {fused.launches} launch, reads {fused.read:,} B, writes {fused.written:,} B ({fused.how})")
_ = reveal("08.softmax-bytes", unfused.total / fused.total)

# %% [markdown]
# All four kernels, fp32 and bf16, on a 64 × 1000 problem (AdamW: 64 000 parameters): the unfused torch sequence
# (AdamW: `torch.optim.AdamW(foreach=False)`, whose bf16 case first converts the gradient to fp32) against the
# fused kernel, measured in the interpreter and checked against the model:

# %% [markdown] lang="zh" en="c502cf3979eb"
# 四个内核，fp32 和 bf16，在 64 × 1000 的问题上（AdamW：64 000 个参数）：未融合的 torch 序列（AdamW 用
# `torch.optim.AdamW(foreach=False)`，其 bf16 情形会先把梯度转换为 fp32）与融合内核对比；融合内核的字节数在
# 解释器中实测，并与模型核对：

# %%
rows, cols = 64, 1000
print(f"{'kernel':<10} {'dtype':<5} {'torch ops':>9} {'unfused B':>11} {'fused B':>10} {'saving':>7}")
for name in KB.NAMES:
    for dtype in ("fp32", "bf16"):
        u = T.torch_traffic(KB.run_unfused, name, KB.make_inputs(name, rows, cols, dtype))
        f = T.fused_traffic(name, rows, cols, dtype)
        if MODE.interpreted:  # the interpreter's count of the real kernel equals the model, byte for byte
            m = T.triton_traffic(KB.run_fused, name, KB.make_inputs(name, rows, cols, dtype))
            assert (m.read, m.written, m.launches) == (f.read, f.written, 1), (name, dtype, m, f)
        print(f"{name:<10} {dtype:<5} {u.launches:>9} {u.total:>11,} {f.total:>10,} {u.total / f.total:>6.2f}x")

# %% [markdown]
# The saving is the number of passes the chain makes over the data: 2x for bias + GELU (two ops), 4x for the
# softmax, about 5.9x for LayerNorm. AdamW saves less in proportion (2.9x in fp32) because even the fused kernel must read
# four tensors and write three; with bf16 gradients the unfused path also pays for converting them.
#
# ### 2.7 On the roofline
#
# Same FLOPs, fewer bytes: fusion moves an op to the right on notebook 07's roofline (higher arithmetic intensity),
# and for memory-bound ops the roof rises with it. This machine's ceilings, measured as in notebook 07:

# %% [markdown] lang="zh" en="81b2e54140f0"
# 节省的倍数就是算子串对数据所走的遍数：bias + GELU 为 2 倍（两个算子），softmax 为 4 倍，LayerNorm 约为 5.9 倍。
# AdamW 按比例节省得少一些（fp32 下为 2.9 倍），因为即使是融合内核，也必须读四个张量、写三个张量；使用 bf16 梯度时，
# 未融合的路径还要为转换梯度付出代价。
#
# ### 2.7 在屋顶线图上
#
# FLOP 数相同，字节数更少：融合把一个算子在 notebook 07 的屋顶线图上向右移动（算术强度更高），而对访存密集型
# 算子来说，屋顶也随之升高。本机的各项上限，按 notebook 07 的方法实测：

# %%
# NBVAL_IGNORE_OUTPUT
shapes = None if device.is_cuda(dev) else ((512, 512, 512), (1024, 1024, 1024))
peak = bench.peak_matmul_flops("fp32", dev, shapes)
bw = bench.memory_bandwidth(256 * 2**20, dev)
print(f"fp32 matmul peak {peak.flops_per_s / 1e9:.1f} GFLOP/s, copy bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s: "
      f"ridge point {R.ridge_point(peak.flops_per_s, bw.bytes_per_s):.1f} FLOP/byte (fp32, one thread)")

# %% [markdown]
# Then the timings, on a problem big enough to time (2048 × 2048 on a CPU, 4096 × 4096 on a GPU), round-robin in one
# run (`KB.race`). **On a CPU the Triton kernels are not timed: an interpreter timing measures NumPy and Python, not
# a kernel**, so the fused point is drawn *at its roof* (the time its bytes need at the measured bandwidth), marked
# "(roof)", and torch's own fused library ops (`torch.softmax`, `F.layer_norm`, `AdamW(fused=True)`; bias + GELU
# has none), timed and placed as a third point, show where a real one-pass kernel lands on this CPU. On a GPU the
# Triton kernels are timed like the rest.

# %% [markdown] lang="zh" en="62f12d4c7da8"
# 然后是计时，问题规模大到足以计时（CPU 上 2048 × 2048，GPU 上 4096 × 4096），在一次运行中轮流执行
# （`KB.race`）。**在 CPU 上不对 Triton 内核计时：解释器的计时测的是 NumPy 和 Python，而不是内核**，因此融合
# 内核的点画在*其屋顶上*（按实测带宽搬运它的字节数所需的时间），并标为“(roof)”；torch 自带的融合库算子
# （`torch.softmax`、`F.layer_norm`、`AdamW(fused=True)`；bias + GELU 没有对应的库算子）经过计时后作为第三个点
# 画出，展示真正的单遍内核在这台 CPU 上落在哪里。在 GPU 上，Triton 内核和其他实现一样计时。

# %%
# NBVAL_IGNORE_OUTPUT
big = (2048, 2048) if MODE.interpreted else (4096, 4096)
times = {name: KB.race(name, *big, repeats=5, compile=not MODE.interpreted) for name in KB.NAMES}
points = {}
for name in KB.NAMES:
    counted = {how: T.torch_traffic(KB.run_unfused, name, KB.make_inputs(name, *big), library=how == "eager library")
               for how in ("eager unfused", "eager library") if how in times[name]}
    fus = T.cost(name, *big, T.fused_traffic(name, *big))
    t_fused = times[name].get("triton") or max(fus.bytes / bw.bytes_per_s, fus.flops / peak.flops_per_s)
    points[name] = [R.place(T.cost(name, *big, c), times[name][how], peak.flops_per_s, bw.bytes_per_s,
                            f"{name} {'unfused' if how == 'eager unfused' else 'torch library'}")
                    for how, c in counted.items()]
    points[name].insert(1, R.place(fus, t_fused, peak.flops_per_s, bw.bytes_per_s,
                                   f"{name} triton" + ("" if "triton" in times[name] else " (roof)")))
pairs = [(pts[0], pts[1]) for pts in points.values()]
print(R.table([p for pts in points.values() for p in pts]))

# %%
fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
for ax, (name, pts) in zip(axes.flat, points.items()):
    R.plot({"fp32": peak.flops_per_s}, bw.bytes_per_s, pts, ax=ax, intensity_range=(0.05, 50),
           title=f"{name}: unfused torch, fused Triton" + (", torch library" if len(pts) > 2 else ""))
plt.tight_layout()
plt.show()

# %% [markdown]
# A measured point *above* 100 % of its roof is not an error (notebook 07), for two reasons. **Write-allocate:**
# the roof was measured with `dst.copy_(src)` and counted as 2 bytes moved per byte copied, but a CPU that stores
# into a cache line it does not hold first reads that line from memory (read for ownership), so the bus carried 3.
# An op that mostly reads (a reduction such as `amax`, whose output is one value per row) pays that tax on few
# bytes, and an op that updates in place (AdamW's `p.mul_`, `m.lerp_`, `v.mul_`) writes lines it has just read and
# pays none: their counted bytes per second can beat the copy's. **Cache reuse:** the copies were 256 MiB, far larger
# than the caches, while part of a 16 MiB tensor can stay in the last-level cache between two ops.

# %% [markdown] lang="zh" en="9038249d0ec5"
# 实测点*高于*其屋顶的 100 % 并不是错误（notebook 07），原因有两个。**写分配（write-allocate）：** 屋顶是用
# `dst.copy_(src)` 测得的，按每拷贝 1 字节搬运 2 字节计算；但 CPU 向一个不在缓存中的缓存行写入时，会先从内存
# 读入该行（为获取所有权而读，RFO），所以总线上实际传输了 3 字节。以读为主的算子（例如 `amax` 这样的归约，每行
# 只输出一个值）只在很少的字节上付这笔“税”，而原地更新的算子（AdamW 的 `p.mul_`、`m.lerp_`、`v.mul_`）写入的是
# 刚刚读过的缓存行，根本不用付：按计数的字节算，它们每秒搬运的字节数可以超过拷贝操作。**缓存复用：** 测拷贝带宽时
# 用的是 256 MiB，远大于各级缓存，而一个 16 MiB 张量的一部分可以在两个算子之间留在末级缓存中。

# %% [markdown]
# The bounds follow from the intensities, which are exact (counted bytes, the FLOP convention of
# `T.FLOPS_PER_ELEMENT`). A machine has one ridge point per roof, peak FLOP/s over bandwidth: this CPU's fp32 ridge
# is printed above, from its measured peak and copy bandwidth. A GPU has several roofs, and they differ by an order
# of magnitude; from the H100 SXM datasheet (dense figures, 3.35 TB/s of HBM3):

# %% [markdown] lang="zh" en="682f79c1b04f"
# 这些判定（访存密集型还是计算密集型）由算术强度决定，而算术强度是精确的（字节数是数出来的，FLOP 按
# `T.FLOPS_PER_ELEMENT` 的约定计算）。一台机器的每个屋顶都有一个脊点，即峰值 FLOP/s 除以带宽：本 CPU 的 fp32 脊
# 点已在上面打印，由实测峰值和拷贝带宽算出。GPU 有好几个屋顶，彼此相差一个数量级；以下数据来自 H100 SXM 的数据手
# 册（稠密算力，HBM3 带宽 3.35 TB/s）：

# %%
H100_TFLOPS = {"fp32 (CUDA cores)": 67, "TF32 (tensor cores)": 495, "bf16 (tensor cores)": 989}  # NVIDIA datasheet
ridges = {roof: tflops * 1e12 / 3.35e12 for roof, tflops in H100_TFLOPS.items()}
print("  ".join(f"{roof}: ridge {r:.0f} FLOP/B" for roof, r in ridges.items()))
assert max(f.intensity for _, f in pairs) < min(ridges.values()) / 4

# %% [markdown]
# Every one of these ops, fused or not, sits far left of even the lowest of them: memory-bound everywhere. Fusion
# multiplies each intensity by the saving counted in section 2.6:

# %% [markdown] lang="zh" en="961da69e4b48"
# 这些算子无论融合与否，都远远位于其中最低的那个脊点的左侧：在哪里都是访存密集型。融合把每个算子的算术强度乘以
# 第 2.6 节统计出的节省倍数：

# %%
for unf_pt, fus_pt in pairs:
    print(f"{unf_pt.name:<18} {unf_pt.intensity:6.3f} FLOP/B -> fused {fus_pt.intensity:6.3f} FLOP/B")
assert all(f.intensity > 1.9 * u.intensity and f.intensity < 5 for u, f in pairs)

# %% [markdown]
# ### 2.8 Timings: a GPU question
#
# On a GPU, the cell below prints each Triton kernel's time against torch eager (unfused and library) and
# `torch.compile`, as ratios measured in one run. On a CPU it prints why it does not: the interpreter runs every
# program as Python and NumPy, thousands of times slower than any kernel, and says nothing about the kernel's speed.
# What carries over from the CPU is the bytes, above, and the bytes are what a memory-bound kernel's time is made of.

# %% [markdown] lang="zh" en="87110e96ffd8"
# ### 2.8 计时：只有 GPU 才能回答的问题
#
# 在 GPU 上，下面的单元格打印每个 Triton 内核的时间，以及 torch eager（未融合版本和库算子）和 `torch.compile` 相
# 对于它的倍数，全部在同一次运行中测得。在 CPU 上，它会打印为什么不这样做：解释器把每个程序实例当作 Python 和
# NumPy 代码运行，比任何内核都慢几千倍，完全无法反映内核的速度。能从 CPU 沿用到 GPU 的，是上面的字节数，而访存密
# 集型内核的运行时间正是由字节数决定的。

# %%
# NBVAL_IGNORE_OUTPUT
if not MODE.interpreted:
    for name, t in times.items():
        print(f"{name:<10} triton {t['triton'] * 1e6:8.1f} µs  " + "  ".join(
            f"{k} {v / t['triton']:.2f}x" for k, v in t.items() if k != "triton"))
else:
    interp = bench.time_fn(lambda: kernels.softmax(x), warmup=1, repeats=3).median
    torch_s = bench.time_fn(lambda: torch.softmax(x, -1), warmup=1, repeats=3).median
    print(f"Interpreter timings mean nothing: softmax of 64 x 1000 took {interp * 1e3:.0f} ms in the interpreter "
          f"and {torch_s * 1e6:.0f} µs as torch.softmax ({interp / torch_s:,.0f}x): that is NumPy and Python, not a "
          "kernel. Run this notebook on a CUDA GPU (make gpu-check) for real Triton timings.")

# %% [markdown]
# ## 3. Stretch: FlashAttention's forward pass
#
# Attention `softmax(Q K^T / sqrt(d)) V` done the textbook way writes the N × N score matrix `S` to memory,
# reads it for the softmax, writes the probabilities `P`, and reads them again for `P V`: O(N²) bytes per head,
# which at N = 16 384 is 1 GiB per head in fp32. FlashAttention never stores them. Each program takes a block of
# `BLOCK_M` queries and walks K and V in tiles of `BLOCK_N` keys; for each tile it computes the
# (BLOCK_M, BLOCK_N) scores in registers and folds them into three running quantities per query row:
#
# - `m_i`, the max of the scores seen so far;
# - `l_i`, the sum of `exp(s - m_i)` seen so far;
# - `acc`, the sum of `exp(s - m_i) * v` seen so far.
#
# When a tile raises the max from `m_i` to `m_new`, everything summed so far used the old max and is too large by
# `exp(m_new - m_i)`: multiply `l_i` and `acc` by `alpha = exp(m_i - m_new)` before adding the new tile (the
# **online softmax**). At the end `o = acc / l_i`. This is the algorithm of FlashAttention-2's forward pass, the
# kernel that Stanford CS336's assignment 2 asks its students to write.
#
# **08.flash-attention.** Complete the update inside the loop; `tl.dot(p, v, input_precision="ieee")` multiplies
# a probability tile by a V tile. (The tiles are converted to fp32 after loading, section 4 says why, and `tl.dot`
# is asked for IEEE fp32 rather than the TF32 a GPU would use by default. A production kernel feeds bf16 tiles to
# `tl.dot` and lets the tensor cores accumulate in fp32: labkit's kernel does that when it is compiled for a GPU
# with bf16 inputs (its `DOT_16BIT` flag), and `make gpu-check` times it against PyTorch's SDPA.)

# %% [markdown] lang="zh" en="a0534a87fb33"
# ## 3. 进阶：FlashAttention 的前向传播
#
# 按教科书的方式计算注意力 `softmax(Q K^T / sqrt(d)) V`，要把 N × N 的分数矩阵 `S` 写入内存，为 softmax 再读
# 出来，写入概率矩阵 `P`，再为 `P V` 读一遍：每个头 O(N²) 字节，在 N = 16 384 时，fp32 下每个头就是 1 GiB。
# FlashAttention 从不存储这两个矩阵。每个程序实例负责 `BLOCK_M` 个查询组成的一块，并以每块 `BLOCK_N` 个键的分块
# （tile）遍历 K 和 V；对每个分块，它在寄存器中计算 (BLOCK_M, BLOCK_N) 的分数，并把它们合并进每个查询行的三个
# 累计量：
#
# - `m_i`：迄今为止见过的分数的最大值；
# - `l_i`：迄今为止 `exp(s - m_i)` 的和；
# - `acc`：迄今为止 `exp(s - m_i) * v` 的和。
#
# 当一个分块把最大值从 `m_i` 提高到 `m_new` 时，之前累加的所有量用的都是旧的最大值，因而大了 `exp(m_new - m_i)`
# 倍：在加上新分块之前，先把 `l_i` 和 `acc` 乘以 `alpha = exp(m_i - m_new)`（这就是**在线 softmax**）。最后
# `o = acc / l_i`。这正是 FlashAttention-2 前向传播的算法，也是斯坦福 CS336 课程作业 2 要求学生编写的内核。
#
# **08.flash-attention.** 补全循环内部的更新；`tl.dot(p, v, input_precision="ieee")` 把一个概率分块与一个 V
# 分块相乘。（分块在加载后被转换为 fp32，原因见第 4 节；并且要求 `tl.dot` 使用 IEEE fp32，而不是 GPU 默认使用的
# TF32。生产环境中的内核会把 bf16 分块交给 `tl.dot`，让张量核心以 fp32 累加：labkit 的内核在为 GPU 编译且输入
# 为 bf16 时就是这样做的（即它的 `DOT_16BIT` 标志），`make gpu-check` 会把它与 PyTorch 的 SDPA 对比计时。）

# %%
@triton.jit
def my_flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < seq_len,
                other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv, mask=offs_n[:, None] < seq_len, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv, mask=offs_n[:, None] < seq_len, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) scores, registers only
        keep = offs_n[None, :] < seq_len
        if CAUSAL:  # a constexpr: the compiler keeps only one branch
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        ...  # m_new, alpha, p; update l_i and acc (rescaled by alpha), then m_i
        ### BEGIN SOLUTION
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
        ### END SOLUTION
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < seq_len)


check("08.flash-attention", my_flash_kernel)

# %% [markdown]
# One case the update above does not guard: a query row whose *first* key tile is entirely masked. Its max stays
# `-inf`, and `exp(-inf - -inf)` is NaN. The masks of this workbook cannot produce one (the loop starts at key 0,
# which the causal mask keeps for every query, and the length mask removes keys only from the last tile), so the
# grader does not try it; a kernel with padding or sliding-window masks replaces `m_new` by 0 where it is `-inf`
# before the two exponentials.

# %% [markdown] lang="zh" en="76a3f442b98b"
# 上面的更新没有防范一种情况：某个查询行的*第一个*键分块被完全掩盖。这一行的最大值保持为 `-inf`，而
# `exp(-inf - -inf)` 是 NaN。本练习册中的掩码不会产生这种情况（循环从键 0 开始，因果掩码对每个查询都保留键 0；
# 长度掩码只会去掉最后一个分块中的键），所以检查程序不测试它；带填充掩码或滑动窗口掩码的内核，会在计算那两个
# 指数之前，把值为 `-inf` 的 `m_new` 替换为 0。

# %% [markdown]
# The reference kernel (`K.flash_attention_kernel`, launched by `kernels.flash_attention`) against
# `F.scaled_dot_product_attention` in float64, on small shapes: 2 sequences × 2 heads × 100 positions × head dim 16,
# so 4 query blocks of 32 and 4 key tiles of 32, the last ones partly masked. With fp32 tiles the only bf16
# error is the final store, one rounding of the output. Compiled on a GPU, the bf16 path also rounds each
# probability tile P to bf16 before `P @ V` while the row sum keeps fp32: every weight is off by up to 2⁻⁸ of
# itself (half a bf16 ulp), so the output can be off by 2⁻⁸ · max|v| however small it is. `kernels.attention_tolerance(v)` adds that
# absolute term exactly when the kernel takes that path (on this machine, it prints which):

# %% [markdown] lang="zh" en="aacf3a5f42fa"
# 参考内核（`K.flash_attention_kernel`，由 `kernels.flash_attention` 启动）与 float64 下的
# `F.scaled_dot_product_attention` 对比，使用较小的形状：2 个序列 × 2 个头 × 100 个位置 × 头维度 16，因此有 4 个
# 大小为 32 的查询块和 4 个大小为 32 的键分块，最后一个查询块和最后一个键分块都有一部分被掩盖。分块为 fp32 时，
# 唯一的 bf16 误差来自最后的存储，即对输出的一次舍入。在 GPU 上编译后，bf16 路径还会在 `P @ V` 之前把每个概率
# 分块 P 舍入为 bf16，而行和保持 fp32：每个权重的误差最多为其自身的 2⁻⁸（半个 bf16 ulp），因此不论输出本身多小，
# 其误差都可能达到 2⁻⁸ · max|v|。`kernels.attention_tolerance(v)` 只在内核走这条路径时才加上这一绝对误差项（本机
# 走的是哪条路径，下面会打印出来）：

# %%
for dtype, causal in (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)):
    q, k, v = (kernels.randn(2, 2, 100, 16, seed=s, dtype=dtype) for s in (1, 2, 3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    rtol, atol = kernels.attention_tolerance(v)  # kernels.tolerance(dtype), plus P's rounding on a GPU's bf16 path
    ok, _ = kernels.close(kernels.flash_attention(q, k, v, causal), want, tol=(rtol, atol))
    print(f"{dtype} causal={causal!s:<5}: within rtol {rtol:.3g}, atol {atol:.0e} of SDPA: {ok}")
    assert ok

# %% [markdown]
# The memory it avoids, counted: the textbook attention of `kernels.flash_attention_unfused` (matmul, scale,
# softmax, matmul) under `T.torch_traffic`, against the FlashAttention kernel, for one sequence of 128 positions,
# 2 heads, head dim 16, fp32:

# %% [markdown] lang="zh" en="0cdeb5c8b8e8"
# 它省下的内存，数一数便知：在 `T.torch_traffic` 下运行 `kernels.flash_attention_unfused` 的教科书式注意力
# （矩阵乘法、缩放、softmax、矩阵乘法），与 FlashAttention 内核对比；一个序列，128 个位置，2 个头，头维度 16，
# fp32：

# %%
q, k, v = (kernels.randn(1, 2, 128, 16, seed=s) for s in (4, 5, 6))
naive = T.torch_traffic(kernels.flash_attention_unfused, q, k, v)
scores = 2 * 128 * 128 * 4  # one (N, N) fp32 matrix per head
print(f"textbook: {naive.launches} ops, {naive.total:,} B; largest single write "
      f"{max(o.written for o in naive.ops):,} B = the (N, N) scores of 2 heads ({scores:,} B)")
if MODE.interpreted:
    flash = T.triton_traffic(kernels.flash_attention, q, k, v)
    print(f"flash:    {flash.launches} kernel, {flash.total:,} distinct B (Q, K, V read, O written); "
          f"{flash.requested:,} B requested, K and V once per query block")
    assert flash.total == 4 * q.nbytes and max(o.written for o in naive.ops) == scores

# %% [markdown]
# FlashAttention's extra **footprint** is linear in N: a max and a sum per query row, no N × N matrix. Its
# **traffic** is not. Each of the ⌈N / BLOCK_M⌉ query-block programs reads all of K and V, so a head requests
#
# $$ N d b \left(2 + 2 \lceil N / \mathrm{BLOCK\_M} \rceil\right) \text{ bytes} \quad (b \text{ bytes per element: Q and O once, K and V once per query block}), $$
#
# quadratic in N. Shared memory cannot absorb the re-reads: it belongs to one program, and another program's
# re-read of the same K tile goes out to L2 (and to HBM, unless the head's K and V stay in L2 while its programs
# run). BLOCK_M itself is bounded by the on-chip memory M of an SM: the Q tile (BLOCK_M × d), the K and V tiles and
# the accumulator must fit, so BLOCK_M = Θ(M / d) and the traffic is **Θ(N² d² / M)**, the FlashAttention paper's
# bound (against Θ(N d + N²) for the textbook version). The gain is a factor Θ(M / d²), roughly 2 to 10 for d = 64
# to 128 and 100 to 200 KB of SRAM. The formula against the interpreter's count, for several N and BLOCK_M:

# %% [markdown] lang="zh" en="d70421d9a518"
# FlashAttention 额外的**内存占用**与 N 成线性关系：每个查询行一个最大值和一个和，没有 N × N 矩阵。但它的
# **访存流量**并不是线性的。⌈N / BLOCK_M⌉ 个查询块程序实例中的每一个都要读取全部的 K 和 V，因此每个头请求的
# 字节数为
#
# $$ N d b \left(2 + 2 \lceil N / \mathrm{BLOCK\_M} \rceil\right) \text{ bytes} \quad (b \text{ bytes per element: Q and O once, K and V once per query block}), $$
#
# （b 为每个元素的字节数；Q 读一次、O 写一次，K 和 V 则每个查询块各读一次），与 N 成二次关系。共享内存无法吸收这
# 些重复读取：共享内存属于单个程序实例，另一个程序实例重复读取同一个 K 分块时，要到 L2 去取（如果该头的 K 和 V
# 在其程序实例运行期间没能留在 L2 中，还要到 HBM 去取）。BLOCK_M 本身受限于一个 SM 的片上内存容量 M：Q 分块
# （BLOCK_M × d）、K 和 V 分块以及累加器都必须放得下，所以 BLOCK_M = Θ(M / d)，访存流量为 **Θ(N² d² / M)**，这正
# 是 FlashAttention 论文给出的界（教科书版本为 Θ(N d + N²)）。收益是 Θ(M / d²) 倍：对于 d = 64 到 128、100 到
# 200 KB 的 SRAM，大约是 2 到 10 倍。下面在若干组 N 和 BLOCK_M 下，把公式与解释器的计数对比：

# %%
for n_pos, bm in ((64, 16), (64, 32), (100, 16), (100, 32), (128, 32), (128, 64)):
    want = T.flash_requested(n_pos, 16, bm)  # one head, d = 16, fp32
    if MODE.interpreted:
        q, k, v = (kernels.randn(1, 1, n_pos, 16, seed=s) for s in (4, 5, 6))
        assert T.triton_traffic(kernels.flash_attention, q, k, v, block_m=bm).requested == want, (n_pos, bm)
    print(f"N = {n_pos:>3}, BLOCK_M = {bm:>2}: {want:>8,} B requested = N d 4 (2 + 2 cdiv(N, BLOCK_M))")

# %% [markdown]
# Per head at scale, in fp32 with head dim 64 and BLOCK_M = 128: the K and V reads (all ⌈N / BLOCK_M⌉ of them) are
# Θ(N²) too, 2 d / BLOCK_M score matrices' worth (here exactly one), while the textbook version moves several (S written and read, P
# written and read), and on a GPU many of the re-reads are served by L2:

# %% [markdown] lang="zh" en="680cba632dd4"
# 规模变大时，按单个头计算（fp32、头维度 64、BLOCK_M = 128）：K 和 V 的读取（总共 ⌈N / BLOCK_M⌉ 遍）同样是
# Θ(N²)，相当于 2 d / BLOCK_M 个分数矩阵的量（这里正好是一个），教科书版本则要搬运好几个（S 写一次读一次，P
# 写一次读一次）；况且在 GPU 上，很多重复读取可以由 L2 满足：

# %%
for n_pos in (1024, 4096, 16384, 65536):
    qkvo, rereads = 4 * n_pos * 64 * 4, T.flash_requested(n_pos, 64, 128) - 2 * n_pos * 64 * 4
    print(f"N = {n_pos:>6}: Q, K, V, O {qkvo / 2**20:8.1f} MiB   K, V reads {rereads / 2**20:8.1f} MiB   "
          f"one N x N score matrix {n_pos**2 * 4 / 2**20:10.1f} MiB")

# %% [markdown]
# ## 4. The interpreter is not the hardware
#
# The interpreter runs a kernel's Python with NumPy arrays standing in for blocks. It is excellent for logic
# (indices, masks, the online softmax above) and for counting bytes. But its numerics are not the GPU's. A cast to
# bf16 is the simplest case: torch rounds fp32 to bf16 to nearest (ties to even, notebook 02), and the GPU's
# `cvt.rn.bf16.f32` instruction does the same. The interpreter:

# %% [markdown] lang="zh" en="e0d57590bf87"
# ## 4. 解释器不是硬件
#
# 解释器用 NumPy 数组代替块，运行内核的 Python 代码。它非常适合检验逻辑（下标、掩码、上面的在线 softmax）和统计
# 字节数。但它的数值行为与 GPU 不同。转换为 bf16 是最简单的例子：torch 把 fp32 就近舍入为 bf16（偶数优先，
# notebook 02），GPU 的 `cvt.rn.bf16.f32` 指令也是如此。而解释器：

# %%
xs = kernels.randn(4096, seed=0)
got, want = kernels.cast(xs, torch.bfloat16), xs.to(torch.bfloat16)
ulps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()  # same sign: bit distance = ulps
truncated = (xs.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)  # low 16 bits dropped
print(f"Triton {triton.__version__}, {MODE.name}: its cast vs torch's: {int((ulps > 0).sum())} of 4096 values "
      f"differ, by at most {int(ulps.max())} ulp; equal to plain truncation everywhere: {torch.equal(got, truncated)}")

# %%
if MODE.interpreted:
    assert 0 < int((ulps > 0).sum()) < 4096 and int(ulps.max()) == 1 and torch.equal(got, truncated)
else:  # compiled for a GPU: round to nearest even, as torch
    assert torch.equal(got, want)

# %% [markdown]
# The interpreter **truncates** (rounds toward zero): about half of random values land one ulp closer to zero than
# torch's result, and the error is biased, always toward zero. Asking for round-to-nearest in the kernel
# (`x.to(tl.bfloat16, fp_downcast_rounding="rtne")`) changes nothing in the Triton printed above: "rtne" is already
# the default, and its interpreter casts both the same way. The second difference is
# worse. The interpreter stores bf16 values as 16-bit integers, and arithmetic on them without a conversion to fp32
# first is integer arithmetic on bit patterns. The same sum of 4096 bf16 values near 3, with and without
# `.to(tl.float32)` before `tl.sum`:

# %% [markdown] lang="zh" en="3564ded5b424"
# 解释器做的是**截断**（向零舍入）：随机取的值中，大约一半的结果比 torch 的结果更靠近零一个 ulp，而且误差是有偏
# 的，总是偏向零。在内核中要求就近舍入（`x.to(tl.bfloat16, fp_downcast_rounding="rtne")`），对上面打印的 Triton
# 版本没有任何影响：“rtne”本来就是默认值，该版本的解释器对两种写法的转换完全一样。第二个差异更糟。解释器把 bf16
# 值存储为 16 位整数，不先转换为 fp32 就对它们做运算，就是在对位模式做整数运算。同样是对 4096 个接近 3 的 bf16
# 值求和，分别在 `tl.sum` 之前加上和不加 `.to(tl.float32)`：

# %%
xb = kernels.randn(4096, seed=3, shift=3.0, dtype="bf16")
exact = float(xb.double().sum())
up, raw = kernels.kernel_sum(xb, upcast=True), kernels.kernel_sum(xb, upcast=False)
print(f"exact {exact:.1f}; fp32 sum {up:.1f}; sum in bf16: {raw:.4g} ({abs(raw - exact) / exact:.1e} relative error)")
assert abs(up - exact) < 1e-5 * exact
assert (abs(raw - exact) > exact) if MODE.interpreted else (abs(raw - exact) < 0.05 * exact)

# %% [markdown]
# On a GPU the sum in bf16 is close, within bf16's precision (a few percent at most for 4096 terms). In the
# interpreter it is nonsense, which is why every kernel here converts right after loading (and why the
# FlashAttention tiles are fp32 here: the interpreter's `tl.dot` of bf16 tiles multiplies bit patterns too).
#
# "Close" holds because `tl.sum` is mostly a **tree**: each thread first adds its own few elements (here 32 per
# thread with 4 warps), then the threads' partial sums are combined in pairs, then pairs of pairs, so no running
# sum gets long enough to dwarf what is added to it. The real hazard of a 16-bit accumulator is a **loop-carried** one, `acc = acc + x`
# across a loop: once `acc` is large, its ulp exceeds `x` and the sum stops growing. torch rounds each operation
# as a GPU does, so it shows both on 4096 ones:

# %% [markdown] lang="zh" en="24687a17de1b"
# 在 GPU 上，用 bf16 求和的结果是接近的，误差在 bf16 的精度范围内（4096 项最多百分之几）。在解释器中，结果则毫无
# 意义。这就是为什么这里的每个内核都在加载后立即转换（也是为什么 FlashAttention 的分块在这里使用 fp32：解释器对
# bf16 分块做 `tl.dot` 时，同样是在对位模式做乘法）。
#
# “接近”之所以成立，是因为 `tl.sum` 基本上是一棵**树**：每个线程先把自己负责的少数几个元素相加（这里在 4 个 warp
# 下每个线程 32 个），然后各线程的部分和两两合并，再把合并的结果两两合并，因此没有哪个累加和会大到把新加上的数
# 吃掉（大数吃小数）。16 位累加器真正的风险在于**跨循环迭代**的累加，即在循环中反复执行 `acc = acc + x`：一旦
# `acc` 变大，它的 ulp 就超过了 `x`，和便不再增长。torch 像 GPU 一样对每次运算做舍入，所以可以用 4096 个 1 把
# 两种情况都展示出来：

# %%
one = torch.ones((), dtype=torch.bfloat16)
loop = {dt: torch.zeros((), dtype=dt) for dt in (torch.bfloat16, torch.float16, torch.float32)}
for _ in range(4096):
    loop = {dt: acc + one.to(dt) for dt, acc in loop.items()}
tree = torch.ones(4096, dtype=torch.bfloat16)
while tree.numel() > 1:
    tree = tree[0::2] + tree[1::2]  # one level of the tree, each sum rounded to bf16
print("loop-carried: " + ", ".join(f"{str(dt)[6:]} {float(a):g}" for dt, a in loop.items()) + f"; bf16 tree {float(tree):g}")
assert [float(a) for a in loop.values()] == [256, 2048, 4096] and float(tree) == 4096

# %% [markdown]
# The bf16 accumulator stalls at 256 = 2⁸ (8 significant bits: there the ulp is 2, and 256 + 1 is a tie that rounds
# back to even 256), the fp16 one at 2048 = 2¹¹; the tree, in bf16 too, is exact. This is why FlashAttention's
# `acc` and `l_i` are fp32 even when Q, K and V are bf16: they are loop-carried across all ⌈N / BLOCK_N⌉ key tiles,
# and the tensor cores' `tl.dot` returns fp32 for the same reason.
#
# The other differences worth knowing:
#
# - **Programs run one after another.** On a GPU they run at the same time, so two programs writing the same
#   address race, and atomics contend; the interpreter cannot show a race.
# - **No hardware limits.** A `BLOCK` too large for the GPU's registers or shared memory, `num_warps`, the
#   occupancy: the interpreter ignores them all.
# - **Different math.** On a GPU `tl.exp`, `/` and `tl.sqrt` are fast approximate instructions (a few ulp), and
#   `tl.dot` of fp32 tiles uses TF32 (10-bit mantissa, notebook 05) unless told `input_precision="ieee"`, as the
#   FlashAttention kernels here are: the interpreter computes in full fp32 either way, so it would never show the
#   TF32 error.
# - **Out-of-bounds access.** Without a mask the interpreter reads and writes host memory next to the tensor; a
#   GPU may fault with "illegal memory access", or corrupt silently. The graders above catch it with guard zones
#   and, in the interpreter, by checking every loaded and stored address against the launch's tensors
#   (`T.triton_strays`, the hook `T.triton_traffic` uses); on a GPU, `compute-sanitizer` does that.
# - **No coalescing.** A GPU serves a warp's 32 loads in 32-byte sectors: 32 consecutive fp32 values are 4 sectors
#   (coalesced), 32 values a row apart are 32 sectors, 8 times the traffic for the same bytes used. The
#   interpreter counts elements and bytes requested, never sectors or cache lines, so a kernel that walks a column
#   of a row-major matrix looks as cheap here as one that walks a row; Nsight Compute's sectors per request shows
#   the difference.
#
# So: develop and test a kernel's logic in the interpreter, on a laptop, in CI. But a low-precision kernel's
# numerics (rounding, accumulation, TF32, fast math) can only be tested on the device it will run on, against a
# float64 reference, with a tolerance derived from the format. `make gpu-check` runs this notebook compiled.
#
# ## Summary
#
# - A Triton kernel is launched on a grid of programs; each program handles a block (`tl.arange`), masks the
#   lanes past the end, and moves data with `tl.load` / `tl.store`. A Python launcher chooses block and grid.
# - Fusion is counted in bytes: a chain of torch ops makes one pass through memory per op, a fused kernel one pass
#   in all. Here: 2x for bias + GELU, 4x for softmax, 5.9x for LayerNorm, 2.9x for AdamW. On the roofline fusion
#   moves each op to the right, with the same FLOPs, and for these memory-bound ops the roof rises with it.
# - Load, convert to fp32, compute, convert back when storing: bf16 traffic, fp32 arithmetic. Check against a
#   float64 reference with a tolerance stated from the format (fp32: a few roundings; bf16: one ulp).
# - FlashAttention tiles K and V, keeps the scores in registers and rescales its running sums with an online
#   softmax: no N × N matrix, so its extra memory is linear in N; its traffic is still quadratic, Θ(N² d² / M),
#   because K and V are re-read once per query block, but smaller than the textbook version's.
# - Offsets in int64 (`program_id(0).to(tl.int64)`) once a tensor can pass 2³¹ elements; a row kept in one block
#   must fit in registers, so longer rows loop. A bf16 accumulator carried across a loop stalls (at 256 on ones):
#   accumulate in fp32.
# - Triton's interpreter runs kernels on any CPU, for logic and byte counts. Its numerics (bf16 truncation,
#   integer arithmetic on bf16, no TF32, no concurrency) are not the GPU's, and its timings mean nothing.
#
# Next, [notebook 16](16_triton_attention.ipynb) (optional, after this one) takes Triton further: a tiled matmul
# with autotuning, a looped softmax, FlashAttention's forward with the logsumexp and its backward pass, and a
# LayerNorm backward, checked with `torch.autograd.gradcheck`. In the main sequence, notebook 09 spreads the
# training step over several processes, where the bottleneck becomes communication.

# %% [markdown] lang="zh" en="ed2fd03051e0"
# bf16 累加器停在 256 = 2⁸（8 位有效位：此处 ulp 为 2，256 + 1 恰好位于中点，按偶数优先舍入回 256），fp16 累加器
# 停在 2048 = 2¹¹；同样用 bf16 计算的树形求和则是精确的。这就是为什么即使 Q、K、V 是 bf16，FlashAttention 的
# `acc` 和 `l_i` 也是 fp32：它们要跨越全部 ⌈N / BLOCK_N⌉ 个键分块循环累加；张量核心的 `tl.dot` 返回 fp32 也是
# 出于同样的原因。
#
# 其他值得了解的差异：
#
# - **程序实例一个接一个地运行。** 在 GPU 上它们同时运行，所以两个程序实例写同一个地址会发生竞争，原子操作也会
#   相互争用；解释器无法展示竞争。
# - **没有硬件限制。** 对 GPU 的寄存器或共享内存来说过大的 `BLOCK`、`num_warps`、占用率：解释器全都不管。
# - **数学实现不同。** 在 GPU 上，`tl.exp`、`/` 和 `tl.sqrt` 是快速的近似指令（误差为几个 ulp）；fp32 分块的
#   `tl.dot` 会使用 TF32（10 位尾数，notebook 05），除非像这里的 FlashAttention 内核那样指定
#   `input_precision="ieee"`：解释器无论如何都以完整的 fp32 计算，因此永远不会显示出 TF32 的误差。
# - **越界访问。** 没有掩码时，解释器会读写紧挨着张量的主机内存；GPU 则可能报出“illegal memory access”错误，
#   或者悄无声息地破坏数据。上面的检查程序用保护区（guard zone）来捕捉这类错误，在解释器中还会把每次加载和存储
#   的地址与这次启动的各个张量逐一核对（`T.triton_strays`，即 `T.triton_traffic` 所用的钩子）；在 GPU 上，
#   这件事由 `compute-sanitizer` 来做。
# - **没有合并访存。** GPU 以 32 字节的扇区（sector）为单位响应一个 warp 的 32 次加载：32 个连续的 fp32 值是
#   4 个扇区（合并访存），32 个相隔一行的值则是 32 个扇区，用到的字节数相同，流量却是 8 倍。解释器统计的是请求的
#   元素数和字节数，从不统计扇区或缓存行，所以在这里，沿行主序矩阵的一列遍历的内核，看上去和沿一行遍历的一样
#   便宜；Nsight Compute 的每请求扇区数（sectors per request）能显示出其中的差别。
#
# 所以：在解释器中开发和测试内核的逻辑，可以在笔记本电脑上，也可以在 CI 中。但低精度内核的数值行为（舍入、累加、
# TF32、快速数学）只能在它将要运行的设备上测试，以 float64 为参考，并使用从格式推导出的容差。`make gpu-check`
# 会以编译方式运行本 notebook。
#
# ## 小结
#
# - Triton 内核在由程序实例组成的网格上启动；每个程序实例处理一个块（`tl.arange`），用掩码关闭越过末尾的通道，
#   并用 `tl.load` / `tl.store` 搬运数据。由一个 Python 启动函数选择块大小和网格。
# - 融合以字节数来衡量：一串 torch 算子中的每个算子都要在内存中走一遍，融合内核总共只走一遍。这里：bias + GELU
#   为 2 倍，softmax 为 4 倍，LayerNorm 为 5.9 倍，AdamW 为 2.9 倍。在屋顶线图上，融合在 FLOP 数不变的情况下把
#   每个算子向右移动，而对这些访存密集型算子来说，屋顶也随之升高。
# - 加载，转换为 fp32，计算，存储时再转换回去：访存按 bf16，算术用 fp32。以 float64 为参考进行检查，容差根据
#   格式明确给出（fp32：几次舍入；bf16：一个 ulp）。
# - FlashAttention 对 K 和 V 分块，把分数留在寄存器中，并用在线 softmax 重新缩放其累计和：没有 N × N 矩阵，所以
#   额外内存与 N 成线性关系；它的访存流量仍然是二次的，为 Θ(N² d² / M)，因为每个查询块都要把 K 和 V 重新读一遍，
#   但比教科书版本小。
# - 一旦张量可能超过 2³¹ 个元素，偏移量就要用 int64（`program_id(0).to(tl.int64)`）；放在一个块中的行必须能装进
#   寄存器，所以更长的行要用循环处理。跨循环迭代的 bf16 累加器会停滞（对全 1 求和时停在 256）：要用 fp32 累加。
# - Triton 的解释器可以在任何 CPU 上运行内核，用于检验逻辑和统计字节数。它的数值行为（bf16 截断、对 bf16 做整数
#   运算、没有 TF32、没有并发）与 GPU 不同，它的计时也毫无意义。
#
# 接下来，[notebook 16](16_triton_attention.ipynb)（选学，在本 notebook 之后）会更深入地使用 Triton：一个带自动
# 调优的分块矩阵乘法、一个循环版的 softmax、带 logsumexp 的 FlashAttention 前向及其反向传播，以及一个用
# `torch.autograd.gradcheck` 检查的 LayerNorm 反向。按主线顺序，接下来的 notebook 09 把训练步分布到多个进程上，
# 届时瓶颈就变成了通信。
