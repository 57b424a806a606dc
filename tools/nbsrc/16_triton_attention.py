# %% [markdown]
# # 16 · Triton II: tiled matmul and FlashAttention, forward and backward
#
# Notebook 08 wrote kernels whose rows fit in one block and whose work was elementwise or a row reduction. The
# kernels that matter most in training are neither: a matmul reuses every input many times, and attention needs a
# backward pass that autograd cannot derive through a kernel. This notebook writes both, in the style of the
# FlashAttention-2 kernels that Stanford CS336's systems assignment asks for.
#
# **Objectives**
# - write a tiled matmul: blocks over M, N and K, an fp32 accumulator, a grouped program order for L2 reuse, and
#   `@triton.autotune` over block sizes, `num_warps` and `num_stages`: what each knob does on a GPU, and what the
#   interpreter can and cannot show;
# - loop over a row longer than one block with an online softmax, the bridge to FlashAttention;
# - complete FlashAttention's forward: the logsumexp saved per row, the causal loop stopped at the diagonal,
#   `exp2` with log2(e) folded into the scale, tile sizes against on-chip memory, and why the rescaling is exact;
# - write backward passes: LayerNorm's (the dW/db reduction across rows, without a race) and FlashAttention's
#   (P recomputed from the logsumexp), each as a `torch.autograd.Function` checked with
#   `torch.autograd.gradcheck` in float64 and against torch's gradients.
#
# **Prerequisites:** notebook 07 (the roofline, bytes moved), notebook 08 (Triton's programming model, the
# fused kernels, FlashAttention's online softmax).
#
# **Estimated time:** 50 min
#
# **Where it runs.** As in notebook 08: compiled on a CUDA GPU, in Triton's interpreter everywhere else. The
# interpreter gives real answers and real byte counts; it cannot time a kernel, coalesce a load or run two programs
# at once, and the text says where that matters.

# %% [markdown] lang="zh" en="66f1ef5784fb"
# # 16 · Triton（二）：分块矩阵乘法与 FlashAttention 的前向和反向
#
# notebook 08 写的内核，每一行都能放进一个块，做的要么是逐元素运算，要么是行归约。训练中最重要的内核两者都不
# 是：矩阵乘法会多次复用每一个输入，而注意力需要一个反向传播，autograd 无法穿过内核自动推导出来。本 notebook
# 把这两种内核都写出来，写法与斯坦福大学 CS336 课程的系统作业所要求的 FlashAttention-2 内核一致。
#
# **学习目标**
# - 编写分块矩阵乘法：在 M、N、K 上分块，使用 fp32 累加器，按分组的程序实例顺序提高 L2 复用，并用
#   `@triton.autotune` 在块大小、`num_warps` 和 `num_stages` 上自动调优：弄清每个参数在 GPU 上起什么作用，
#   以及解释器能展示什么、不能展示什么；
# - 用在线 softmax 遍历一个比块更长的行，这是通往 FlashAttention 的桥梁；
# - 补全 FlashAttention 的前向：每行保存的 logsumexp、在对角线处停止的因果循环、把 log2(e) 并入缩放系数的
#   `exp2`、受片上存储限制的分块大小，以及重新缩放为什么是精确的；
# - 编写反向传播：LayerNorm 的反向（跨行的 dW/db 归约，且没有数据竞争）和 FlashAttention 的反向（由 logsumexp
#   重新计算 P），每个都封装为一个 `torch.autograd.Function`，用 float64 下的 `torch.autograd.gradcheck`
#   检查，并与 torch 的梯度对比。
#
# **前置知识：** notebook 07（屋顶线模型、搬运的字节数），notebook 08（Triton 的编程模型、融合内核、
# FlashAttention 的在线 softmax）。
#
# **预计用时：** 50 分钟
#
# **在哪里运行。** 与 notebook 08 相同：在 CUDA GPU 上编译运行，在其他地方用 Triton 的解释器运行。解释器给出的
# 结果和字节数都是真实的；但它无法为内核计时，无法合并访存，也无法同时运行两个程序实例，这些限制在哪里起作用，
# 文中都会说明。

# %%
# %matplotlib inline
# %load_ext labkit
from labkit import kernels

MODE = kernels.setup()  # before triton is imported: interpreter on a CPU, compiled on a CUDA GPU
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import traffic as T
from labkit.check import check

K = kernels.load()  # labkit's reference kernels, decorated in the mode chosen above
print(MODE)

# %% [markdown]
# ## 1. A tiled matmul
#
# `C = A @ B` with A of shape (M, K) and B of shape (K, N). One program computes one (BLOCK_M, BLOCK_N) tile of C.
# It walks K in steps of BLOCK_K: at each step it loads a (BLOCK_M, BLOCK_K) tile of A and a (BLOCK_K, BLOCK_N)
# tile of B and adds their product into an fp32 accumulator that lives in registers. Every element of A is then
# read by ⌈N / BLOCK_N⌉ programs instead of N times, which is what turns a matmul from memory-bound into
# compute-bound (notebook 07's roofline). On a GPU with bf16 inputs the tiles go to `tl.dot` as bf16, the tensor
# cores multiply them and accumulate in fp32; labkit's kernel does that when compiled (`DOT_16BIT`). In the
# interpreter the tiles are converted to fp32 first (notebook 08, section 4: its bf16 arithmetic is integer
# arithmetic on bit patterns).
#
# Pointers advance through A and B with their **strides**, so the same kernel takes a transposed view without a
# copy. The M, N and K indices are masked: the last tiles of an odd shape run past the matrix.
#
# **16.matmul-k-loop.** The kernel below has everything but its K loop. Write it: per step, load the two tiles
# (masked, with a fill that adds nothing to the sum), accumulate, advance both pointer blocks.

# %% [markdown] lang="zh" en="3cf5450b270a"
# ## 1. 分块矩阵乘法
#
# `C = A @ B`，其中 A 的形状为 (M, K)，B 的形状为 (K, N)。一个程序实例（program）计算 C 的一个
# (BLOCK_M, BLOCK_N) 分块。它沿 K 维以 BLOCK_K 为步长前进：每一步加载 A 的一个 (BLOCK_M, BLOCK_K) 分块和 B
# 的一个 (BLOCK_K, BLOCK_N) 分块，再把它们的乘积累加到位于寄存器中的 fp32 累加器里。这样一来，A 的每个元素由
# ⌈N / BLOCK_N⌉ 个程序实例读取，而不是被读取 N 次，正是这一点让矩阵乘法从访存密集型变成计算密集型（notebook 07
# 的屋顶线模型）。在 GPU 上，如果输入是 bf16，分块以 bf16 送入 `tl.dot`，由张量核心相乘，并以 fp32 累加；
# labkit 的内核在编译模式下就是这样做的（`DOT_16BIT`）。在解释器中，分块会先转换为 fp32（notebook 08 第 4 节：
# 解释器中的 bf16 运算是在位模式上做的整数运算）。
#
# 指针按各自的**步长**（stride）在 A 和 B 中前进，所以同一个内核无需复制就能接受转置视图。M、N、K 三个下标都加
# 了掩码：对于不规整的形状，最后几个分块会越过矩阵的边界。
#
# **16.matmul-k-loop.** 下面的内核除了 K 循环之外什么都有了。请写出这个循环：每一步加载两个分块（带掩码，
# 填充值不能给求和带来任何贡献），累加，再把两组指针向前推进。

# %%
@triton.jit
def my_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m, num_pid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_size_m = tl.minimum(num_pid_m - (pid // (GROUP_M * num_pid_n)) * GROUP_M, GROUP_M)
    pid_m = (pid // (GROUP_M * num_pid_n)) * GROUP_M + (pid % (GROUP_M * num_pid_n)) % group_size_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ...  # the K loop: masked loads of the A and B tiles, acc += their product (fp32), advance the pointers
    ### BEGIN SOLUTION
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    ### END SOLUTION
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


check("16.matmul-k-loop", my_matmul_kernel)

# %% [markdown]
# The grader ran your kernel on 64 × 64 × 64, on 33 × 70 × 47, on transposed views (strides that are not those of a
# contiguous matrix) and with bf16 inputs, with every input in a larger buffer whose tail holds NaN and every load
# checked against the tensors (in the interpreter). The tolerance is the
# classic bound of a dot product of length K summed in fp32: `K · 2⁻²⁴ · (|A| @ |B|)` per element
# (`kernels.matmul_close`), plus one bf16 ulp of the result for a bf16 output. A bound relative to the result
# itself would be wrong wherever the terms cancel.
#
# ### 1.1 The program order: grouping for L2
#
# The grid is one-dimensional, and the kernel's first lines turn the program id into a tile (pid_m, pid_n). In
# row-major order, consecutive programs take consecutive tiles of one row of C: they share one tile-row of A but
# each needs a different tile-column of B. A GPU runs a few hundred programs at once, and the tiles they load stay
# in L2 while they run. **Grouped order** sweeps GROUP_M tile-rows column by column instead, so the programs
# running together touch a square of C and share both A's rows and B's columns. The same arithmetic as the kernel,
# in Python, for a 16 × 16 grid of tiles and the first 64 programs to run:

# %% [markdown] lang="zh" en="e90a44113993"
# 评分程序在 64 × 64 × 64 和 33 × 70 × 47 的形状上、在转置视图（步长与连续矩阵不同）上，以及用 bf16 输入运行了
# 你的内核；每个输入都放在一个更大的缓冲区中，缓冲区末尾填的是 NaN，并且（在解释器中）每一次加载都对照张量做了
# 检查。容差用的是长度为 K、以 fp32 求和的点积的经典误差界：每个元素 `K · 2⁻²⁴ · (|A| @ |B|)`
# （`kernels.matmul_close`），对于 bf16 输出再加上结果的一个 bf16 末位单位（ulp）。如果误差界相对于结果本身来
# 定，那么在各项相互抵消的地方就会判错。
#
# ### 1.1 程序实例的顺序：为 L2 分组
#
# 网格是一维的，内核开头几行把程序实例的 id 转换为一个分块 (pid_m, pid_n)。按行优先顺序，相邻的程序实例处理 C
# 同一行中相邻的分块：它们共享 A 的同一行分块，但各自需要 B 的不同的一列分块。GPU 同时运行几百个程序实例，
# 它们加载的分块在运行期间一直留在 L2 中。**分组顺序**则改为逐列扫过 GROUP_M 行分块，这样同时运行的程序实例覆
# 盖 C 的一块方形区域，既共享 A 的行，也共享 B 的列。下面用 Python 做与内核相同的计算，针对一个 16 × 16 的分块
# 网格，看最先运行的 64 个程序实例：

# %%
def tile(pid, num_m, num_n, group_m):
    first = (pid // (group_m * num_n)) * group_m  # the group's first tile-row
    size = min(num_m - first, group_m)
    return first + (pid % (group_m * num_n)) % size, (pid % (group_m * num_n)) // size


touched = {}
for group_m in (1, 8):  # GROUP_M = 1 is plain row-major order
    tiles = [tile(pid, 16, 16, group_m) for pid in range(64)]
    rows, cols = len({m for m, _ in tiles}), len({n for _, n in tiles})
    touched[group_m] = rows + cols
    print(f"GROUP_M = {group_m}: the first 64 programs read {rows} tile-rows of A and {cols} tile-columns of B")
assert touched[8] < touched[1]

# %% [markdown]
# ### 1.2 Autotuning
#
# Which tile sizes are fastest depends on the GPU, the dtype and the shape. `@triton.autotune` takes a list of
# `triton.Config`s and a `key`: on the first launch for each new value of the key arguments it compiles and times
# every config and keeps the fastest. The knobs:
#
# - **BLOCK_M, BLOCK_N, BLOCK_K**: the tile sizes. Larger tiles reuse each load more (intensity grows with the
#   tile) but need more registers and shared memory per program, so fewer programs fit on an SM at once;
# - **GROUP_M**: the grouped order above;
# - **num_warps**: threads per program (32 per warp); more warps share the tile's work and hide latency;
# - **num_stages**: how many shared-memory buffers the K loop gets (software pipelining): the loads of the next
#   `num_stages - 1` steps are in flight while the `tl.dot` of step k runs; each stage costs shared memory for one
#   A and one B tile.
#
# labkit's configurations and the autotuned launch:

# %% [markdown] lang="zh" en="5ca2c17811ce"
# ### 1.2 自动调优
#
# 哪种分块大小最快，取决于 GPU、数据类型和形状。`@triton.autotune` 接受一个 `triton.Config` 列表和一个 `key`：
# key 所列的参数每出现一组新的取值，它都会在第一次启动时编译并计时每一个配置，然后保留最快的那个。
# 可调的参数有：
#
# - **BLOCK_M, BLOCK_N, BLOCK_K**：分块大小。分块越大，每次加载的数据复用得越多（算术强度随分块增大而提高），
#   但每个程序实例需要的寄存器和共享内存也越多，于是一个 SM 上能同时容纳的程序实例就越少；
# - **GROUP_M**：上面讲的分组顺序；
# - **num_warps**：每个程序实例的线程数（每个 warp 32 个线程）；warp 越多，分担分块工作的线程越多，
#   也越能隐藏延迟；
# - **num_stages**：K 循环能用几个共享内存缓冲区（软件流水线）：第 k 步的 `tl.dot` 运行时，后面
#   `num_stages - 1` 步的加载已经在进行中；每多一级，就要多占一个 A 分块和一个 B 分块的共享内存。
#
# labkit 的配置，以及经过自动调优的启动：

# %%
for c in kernels.MATMUL_CONFIGS:
    print(c)
tuned = triton.autotune(configs=kernels.matmul_configs(), key=["M", "N", "K"])(K.matmul_kernel)  # as kernels.matmul
print(f"{MODE.name}: the autotuner gets {len(kernels.matmul_configs())} config(s) here")

# %% [markdown]
# In the interpreter the autotuner gets one config, because it has nothing to time with: Triton's interpreter runs
# each program as NumPy code, one after another, with no GPU driver, and a timing there would measure Python anyway.
# Nor can the interpreter show **coalescing**: a warp's 32 loads of consecutive addresses are served in a few 32-byte
# sectors, while 32 loads a row apart need 32; the interpreter counts bytes, never sectors. `num_warps` and
# `num_stages` change nothing in its answers, and the tile sizes only the order of the fp32 sums, which is the
# point: the logic is checked here, the speed on the GPU (`make gpu-check`). The launcher `kernels.matmul` wraps
# the same kernel in the same `triton.autotune`; against `torch.matmul` on odd shapes and a transposed view:

# %% [markdown] lang="zh" en="4df7eefa638e"
# 在解释器中，自动调优器只拿到一个配置，因为它没有东西可以用来计时：Triton 的解释器把每个程序实例当作 NumPy
# 代码逐个运行，没有 GPU 驱动，而且在那里计时，测到的反正也只是 Python。解释器同样无法展示**合并访存**
# （coalescing）：一个 warp 对连续地址的 32 次加载，只需几个 32 字节的扇区就能完成，而彼此相隔一行的 32 次加载
# 则需要 32 个扇区；解释器统计的是字节数，从不统计扇区。`num_warps` 和 `num_stages` 不会改变它给出的结果，
# 分块大小也只改变 fp32 求和的顺序，而这正是关键所在：逻辑在这里检查，速度到 GPU 上检查（`make gpu-check`）。
# 启动函数 `kernels.matmul` 用同一个 `triton.autotune` 包装同一个内核；下面在不规整的形状和一个转置视图上把它
# 与 `torch.matmul` 对比：

# %%
for m, k, n, dtype in ((33, 70, 47, "fp32"), (100, 37, 65, "fp32"), (33, 70, 47, "bf16")):
    a, b = kernels.randn(m, k, seed=1, dtype=dtype), kernels.randn(n, k, seed=2, dtype=dtype).t()  # b: a view
    ok, worst = kernels.matmul_close(kernels.matmul(a, b), a, b)
    print(f"{dtype} {m} x {k} x {n} (B transposed, strides {b.stride()}): within the fp32 accumulation bound: {ok}")
    assert ok

# %% [markdown]
# ## 2. A row longer than one block: the looped online softmax
#
# Notebook 08's softmax kept a row in one block, and its launcher refuses rows past `kernels.MAX_ROW_BLOCK`
# columns (registers). A longer row is read in blocks. Three passes would do (max, then sum, then write); the online
# softmax folds the first two into one: a running max `m` and a running sum `l`, and when a block raises the max
# from `m` to `m'`, the sum so far is rescaled by `exp(m - m')`. The second pass writes `exp(x - m) / l`. It is
# FlashAttention's trick on one row:

# %% [markdown] lang="zh" en="3808b8497faf"
# ## 2. 比块更长的行：循环式在线 softmax
#
# notebook 08 的 softmax 把一行放进一个块，它的启动函数会拒绝列数超过 `kernels.MAX_ROW_BLOCK` 的行（受寄存器限
# 制）。更长的行要分块读取。三遍扫描就能做到（先求最大值，再求和，最后写出结果）；在线 softmax 把前两遍合成一
# 遍：维护当前最大值 `m` 和累计和 `l`，当某个块把最大值从 `m` 提高到 `m'` 时，就把到目前为止的和乘以
# `exp(m - m')` 重新缩放。第二遍写出 `exp(x - m) / l`。这就是 FlashAttention 的技巧，只不过用在一行上：

# %%
print(kernels.source(K.softmax_looped_kernel))

# %%
x = kernels.randn(3, 20_000, seed=3, scale=4.0)  # past MAX_ROW_BLOCK
y = kernels.softmax_looped(x, block=4096)
print(f"rows of {x.shape[1]:,} in blocks of 4096: within tolerance of torch.softmax: "
      f"{kernels.close(y, torch.softmax(x.double(), -1))[0]}")
assert kernels.close(y, torch.softmax(x.double(), -1))[0]

# %% [markdown]
# Two reads of the row and one write, against three reads for max, sum and write as separate passes. Counted in the
# interpreter, on a smaller matrix:

# %% [markdown] lang="zh" en="7c455a808790"
# 读两遍行、写一遍，而把求最大值、求和、写出分成三遍时要读三遍。在解释器中用一个更小的矩阵来统计：

# %%
xs = kernels.randn(4, 3000, seed=4)
if MODE.interpreted:
    counted = T.triton_traffic(kernels.softmax_looped, xs, block=1024)
    print(f"requested {counted.requested:,} B = {counted.requested / xs.nbytes:g} x the matrix")
    assert counted.requested == 3 * xs.nbytes and (counted.read, counted.written) == (xs.nbytes, xs.nbytes)

# %% [markdown]
# ## 3. FlashAttention's forward, complete
#
# Notebook 08's kernel returned O. A training kernel must also leave what the backward needs, and do less work:
#
# - **The logsumexp.** Per query row, `L = m + log(l)` with the final max and sum. Then
#   `P = exp(S - L)` is the softmax row exactly, and the backward can recompute any tile of P from S and L without
#   the running statistics. One number per row: the N × N matrix is still never stored.
# - **The causal stop.** With a causal mask, query block i needs keys up to its own last row only. The loop ends at
#   `min((i + 1) · BLOCK_M, N)`, so the tiles above the diagonal are never loaded: about half the work and half the
#   K and V traffic.
# - **exp2.** A GPU's special-function unit computes `2^x` (`ex2`); `exp(x)` costs a multiply by log2(e) more.
#   Scaling the scores once by `scale · log2(e)` turns every exponential into `exp2` and removes one multiply per
#   score; the running max is then in base-2 units (the sum `l` is the same number either way), and `L` is
#   converted back (`· ln 2`).
#
# **Why the rescaling is exact.** After the tiles seen so far, `l = Σ exp(s_j - m)` and `acc = Σ exp(s_j - m) v_j`
# with the current max m. A new tile raises the max to m' ≥ m; since `exp(s_j - m') = exp(s_j - m) · exp(m - m')`,
# multiplying `l` and `acc` by `α = exp(m - m')` gives exactly the sums against m', and the new tile's terms are
# added against m' too. At the end, `acc / l` is `Σ exp(s_j - m) v_j / Σ exp(s_j - m)` for the true max: the
# softmax, whatever the order of the tiles. (Only the roundings differ.)

# %% [markdown] lang="zh" en="edb75b131241"
# ## 3. 完整的 FlashAttention 前向
#
# notebook 08 的内核返回 O。训练用的内核还必须留下反向传播需要的东西，并且少做一些工作：
#
# - **logsumexp。** 对每个查询行，用最终的最大值和累计和计算 `L = m + log(l)`。于是 `P = exp(S - L)` 恰好就是
#   softmax 的那一行，反向传播可以由 S 和 L 重新计算 P 的任意一个分块，而不需要那些中间统计量。每行只有一个
#   数：N × N 矩阵依然从不存储。
# - **因果截止。** 使用因果掩码时，第 i 个查询块只需要截至它自己最后一行的那些键。循环在
#   `min((i + 1) · BLOCK_M, N)` 处结束，因此对角线上方的分块从不加载：大约省下一半的计算量，以及一半的
#   K、V 访存量。
# - **exp2。** GPU 的特殊函数单元计算的是 `2^x`（`ex2`）；`exp(x)` 还要多乘一次 log2(e)。把分数一次性乘以
#   `scale · log2(e)`，就能把每个指数运算都变成 `exp2`，每个分数省掉一次乘法；这样当前最大值就以 2 为底来表示
#   （累计和 `l` 无论用哪种方式都是同一个数），最后再把 `L` 换算回来（`· ln 2`）。
#
# **重新缩放为什么是精确的。** 处理完目前见过的分块之后，在当前最大值 m 下有 `l = Σ exp(s_j - m)` 和
# `acc = Σ exp(s_j - m) v_j`。新的分块把最大值提高到 m' ≥ m；由于
# `exp(s_j - m') = exp(s_j - m) · exp(m - m')`，把 `l` 和 `acc` 都乘以 `α = exp(m - m')`，得到的恰好是相对于
# m' 的和，而新分块的各项也是相对于 m' 加进去的。最后，`acc / l` 就是在真实最大值下的
# `Σ exp(s_j - m) v_j / Σ exp(s_j - m)`：无论分块的顺序如何，结果都是 softmax。（不同的只有舍入。）

# %%
print(kernels.source(K.flash_fwd_kernel).split("    start_m = tl.program_id(0)")[1])

# %%
for n_pos, causal in ((37, False), (100, True), (64, True)):
    q, k, v = (kernels.randn(2, 1, n_pos, 16, seed=s) for s in (5, 6, 7))
    o, lse = kernels.flash_attention_fwd(q, k, v, causal)
    s = (q.double() @ k.double().transpose(-1, -2)) * 16**-0.5
    s = s.masked_fill(torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1), float("-inf")) if causal else s
    ok_o = kernels.close(o, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal))[0]
    ok_l = kernels.close(lse, torch.logsumexp(s, -1))[0]
    print(f"N = {n_pos:>3}, causal = {causal!s:<5}: O within tolerance of SDPA {ok_o}, L of torch.logsumexp {ok_l}")
    assert ok_o and ok_l

# %% [markdown]
# **16.causal-tiles.** With N = 160 and BLOCK_M = BLOCK_N = 32, how many K tiles does the causal forward load in
# all, over the query blocks of one head? (The loop without the stop would load every tile for every block.)

# %% [markdown] lang="zh" en="21f67e07831b"
# **16.causal-tiles.** 当 N = 160、BLOCK_M = BLOCK_N = 32 时，因果前向在一个注意力头的所有查询块上总共加载多少
# 个 K 分块？（没有截止的循环会为每个块加载所有分块。）

# %%
answer = ...  # a number of K tiles
### BEGIN SOLUTION
answer = sum(min(i + 1, 5) for i in range(5))  # block i loads the tiles 0 .. i
### END SOLUTION
check("16.causal-tiles", answer)

# %% [markdown]
# The causal stop, counted: with BLOCK_M = BLOCK_N = 16 and N = 64, query block i loads (i + 1) key tiles instead of
# all 4. The bytes requested, against the formula (Q read and O written once, L written once, K and V for the keys
# each block loads):

# %% [markdown] lang="zh" en="a29c253be3ca"
# 把因果截止实际数一数：当 BLOCK_M = BLOCK_N = 16、N = 64 时，第 i 个查询块加载 (i + 1) 个键分块，而不是全部 4
# 个。下面把请求的字节数与公式对照（Q 读一次、O 写一次，L 写一次，再加上每个块所加载的键对应的 K 和 V）：

# %%
n_pos, d, bm = 64, 16, 16
q, k, v = (kernels.randn(1, 1, n_pos, d, seed=s) for s in (5, 6, 7))
for causal in (False, True):
    keys = sum(min((i + 1) * bm, n_pos) if causal else n_pos for i in range(triton.cdiv(n_pos, bm)))
    want = 4 * (2 * n_pos * d + 2 * keys * d + n_pos)
    if MODE.interpreted:
        assert T.triton_traffic(kernels.flash_attention_fwd, q, k, v, causal).requested == want, causal
    print(f"causal = {causal!s:<5}: {keys} key rows loaded, {want:,} B requested")

# %% [markdown]
# **Tile sizes against on-chip memory.** A program keeps its Q tile, the K and V tiles of `num_stages` steps in
# flight, and the fp32 accumulator. With bf16 and head dim 128 (the H100 has 228 KB of shared memory per SM, of
# which one thread block may use 227 KB, from NVIDIA's Hopper tuning guide), the bytes per program:

# %% [markdown] lang="zh" en="36e3e42ef465"
# **分块大小与片上存储。** 一个程序实例要存放它的 Q 分块、`num_stages` 步在途的 K 和 V 分块，以及 fp32
# 累加器。对于 bf16、头维度 128 的情形（根据 NVIDIA 的 Hopper 调优指南，H100 每个 SM 有 228 KB 共享内存，
# 单个线程块最多可用其中的 227 KB），每个程序实例需要的字节数：

# %%
for bm, bn, stages in ((64, 64, 2), (128, 64, 2), (128, 128, 3)):
    q_tile, kv_tiles, acc_tile = bm * 128 * 2, stages * 2 * bn * 128 * 2, bm * 128 * 4
    total = q_tile + kv_tiles
    print(f"BLOCK_M {bm:>3}, BLOCK_N {bn:>3}, {stages} stages: Q {q_tile // 1024:>3} KB + K, V {kv_tiles // 1024:>3} KB "
          f"= {total // 1024:>3} KB of shared memory (+ {acc_tile // 1024} KB of fp32 acc in registers); "
          f"{'fits' if total <= 227 * 1024 else 'does not fit'} in 227 KB")

# %% [markdown]
# The larger the query tile, the fewer times K and V are read (notebook 08: Θ(N² d² / M)); the limit is the SM's
# memory, and a tile that leaves room for only one program per SM hides no latency (the last line also leaves
# Triton almost no scratch for its layout conversions, so it may not compile at all). This is the trade-off the
# autotuner settles on a real GPU.
#
# ## 4. Backward passes
#
# A kernel is opaque to autograd: `kernels.layernorm` returns tensors without a graph. To train through it, wrap
# it in a `torch.autograd.Function` whose `forward` saves what the backward needs and whose `backward` runs a
# backward kernel. The check is `torch.autograd.gradcheck`: it compares the backward with finite differences of
# the forward, which needs float64 (fp32 finite differences are noise), so the kernels take a compute dtype and
# run in float64 here, in the interpreter. `fast_mode=True` checks the Jacobian along random directions, a few
# launches instead of one per input element.
#
# ### 4.1 LayerNorm backward, and the reduction across rows
#
# With `x̂ = (x - mean) · rstd` and `y = x̂ · w + b`, per row:
# `dx = rstd · (w·dy - mean(w·dy) - x̂ · mean(w·dy · x̂))`, from the saved mean and rstd. That part is per row, like
# the forward. The weight gradients are not: `dw = Σ_rows dy · x̂` and `db = Σ_rows dy` sum over **all** rows, and
# the rows belong to different programs. If every program added its row into `dw` with a load, an add and a store,
# two programs running at once would both load the old value and one addition would be lost: a **race**. The
# interpreter runs programs one after another, so it would never show it. Atomics (`tl.atomic_add`) are correct but
# add in whatever order the programs arrive, so fp32 results change from run to run. labkit's backward does it in
# two stages without either: `groups` programs each sum every `groups`-th row into their **own** row of a
# (groups, cols) buffer, then a second kernel sums the buffer's columns in a fixed order. Stage 1 (the autograd
# wrapper, `kernels.LayerNorm`, saves x, w, mean and rstd in its forward and calls this in its backward):

# %% [markdown] lang="zh" en="06cc96e49724"
# 查询分块越大，K 和 V 被读取的次数就越少（notebook 08：Θ(N² d² / M)）；上限来自 SM 的存储容量，而一个大到每个
# SM 只能放下一个程序实例的分块，无法隐藏任何延迟（最后一行的配置也几乎没给 Triton 留下做布局转换的临时空间，
# 因此可能根本编译不了）。这正是自动调优器在真实 GPU 上要做的权衡。
#
# ## 4. 反向传播
#
# 内核对 autograd 是不透明的：`kernels.layernorm` 返回的张量不带计算图。要在训练中让梯度穿过它，就要把它封装在
# 一个 `torch.autograd.Function` 中：它的 `forward` 保存反向传播需要的东西，它的 `backward` 运行一个反向内核。
# 检查的工具是 `torch.autograd.gradcheck`：它把反向传播与前向的有限差分相比较，这需要 float64（fp32 的有限差分
# 只是噪声），所以这些内核接受一个计算用的数据类型，在这里以 float64 在解释器中运行。`fast_mode=True` 沿随机方
# 向检查雅可比矩阵，只需启动几次，而不是每个输入元素启动一次。
#
# ### 4.1 LayerNorm 的反向，以及跨行的归约
#
# 设 `x̂ = (x - mean) · rstd`、`y = x̂ · w + b`，则对每一行有：
# `dx = rstd · (w·dy - mean(w·dy) - x̂ · mean(w·dy · x̂))`，由保存下来的 mean 和 rstd 算出。这一部分按行进行，
# 和前向一样。权重梯度则不然：`dw = Σ_rows dy · x̂` 和 `db = Σ_rows dy` 要对**所有**行求和，而这些行属于不同的
# 程序实例。如果每个程序实例都用一次加载、一次加法和一次存储把自己的行加到 `dw` 上，那么两个同时运行的程序实例
# 会都加载到旧值，其中一次加法就会丢失：这就是**数据竞争**。解释器逐个运行程序实例，所以永远不会暴露这个问题。
# 原子操作（`tl.atomic_add`）是正确的，但它按程序实例到达的任意顺序相加，所以 fp32 结果每次运行都会不同。
# labkit 的反向传播分两个阶段完成，两种问题都没有：`groups` 个程序实例各自负责每 `groups` 行中的一行，
# 把它们加到一个 (groups, cols) 缓冲区中**属于自己**的那一行，然后由第二个内核按固定顺序对缓冲区的各列求和。
# 下面是第 1 阶段（autograd 封装 `kernels.LayerNorm` 在它的 forward 中保存 x、w、mean 和 rstd，并在 backward
# 中调用这个内核）：

# %%
print(kernels.source(K.layernorm_bwd_kernel))

# %%
x, w, b = kernels.randn(5, 30, seed=7), kernels.randn(30, seed=8, shift=1.0), kernels.randn(30, seed=9)
x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
ok = torch.autograd.gradcheck(lambda *t: kernels.LayerNorm.apply(*t, 1e-5), (x64, w64, b64), fast_mode=True)
print(f"gradcheck of the LayerNorm kernels in float64 (5 x 30): {ok}")
assert ok

# %%
x32, w32, b32 = (t.clone().requires_grad_() for t in (x, w, b))
dy = kernels.randn(5, 30, seed=10)
kernels.LayerNorm.apply(x32, w32, b32, 1e-5).backward(dy)
F.layer_norm(x64, [30], w64, b64, 1e-5).backward(dy.double())  # torch's gradients, in float64
for name, mine, ref in (("dx", x32, x64), ("dw", w32, w64), ("db", b32, b64)):
    print(f"{name}: fp32 kernels within tolerance of torch's float64 gradient: {kernels.close(mine.grad, ref.grad)[0]}")
    assert kernels.close(mine.grad, ref.grad)[0]

# %% [markdown]
# ### 4.2 FlashAttention's backward
#
# Forward, per row: `S = Q Kᵀ · scale`, `P = softmax(S)`, `O = P V`. Backward, from `dO`:
#
# - `dV = Pᵀ dO` and `dP = dO Vᵀ`;
# - through the softmax, row by row: `dS = P ∘ (dP - δ)` with `δ = rowsum(dP ∘ P) = rowsum(dO ∘ O)` (one number
#   per row, computed once before the kernel);
# - `dQ = dS K · scale` and `dK = dSᵀ Q · scale`.
#
# No P is stored: each program recomputes its tiles as `P = exp(S - L)` from the saved logsumexp. One program per
# block of keys walks the query blocks (from the diagonal on, when causal). It owns its rows of dK and dV, which
# accumulate in registers. dQ is different: every key block contributes to every query row, so the programs must add
# their shares into dQ in memory, with `tl.atomic_add` (FlashAttention-2's Triton tutorial instead runs a second
# loop, one program per query block, to keep dQ deterministic).
#
# **16.flash-bwd.** The kernel below recomputes P; write the update: dV, dP, dS, dK, and add this tile's share of
# dQ into `dq_ptr + q_offs` (masked by `m_mask`).

# %% [markdown] lang="zh" en="1348c9174b73"
# ### 4.2 FlashAttention 的反向
#
# 前向，对每一行：`S = Q Kᵀ · scale`，`P = softmax(S)`，`O = P V`。反向，从 `dO` 出发：
#
# - `dV = Pᵀ dO`，`dP = dO Vᵀ`；
# - 逐行穿过 softmax：`dS = P ∘ (dP - δ)`，其中 `δ = rowsum(dP ∘ P) = rowsum(dO ∘ O)`（每行一个数，
#   在启动内核之前计算一次）；
# - `dQ = dS K · scale`，`dK = dSᵀ Q · scale`。
#
# P 不做存储：每个程序实例由保存下来的 logsumexp 按 `P = exp(S - L)` 重新计算自己的分块。每个键块对应一个程序
# 实例，由它遍历各个查询块（因果情形下从对角线开始）。它独占 dK 和 dV 中属于自己的那些行，这些行在寄存器中累
# 加。dQ 则不同：每个键块都对每个查询行有贡献，所以各程序实例必须用 `tl.atomic_add` 把各自的份额加到内存中的
# dQ 上（FlashAttention-2 的 Triton 教程则另外运行第二个循环，每个查询块一个程序实例，以保证 dQ 的确定性）。
#
# **16.flash-bwd.** 下面的内核已经重新计算了 P；请写出更新部分：dV、dP、dS、dK，并把这个分块对 dQ 的份额加到
# `dq_ptr + q_offs` 上（用 `m_mask` 做掩码）。

# %%
@triton.jit
def my_flash_bwd_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                        CDT: tl.constexpr):
    start_n, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n, offs_d = start_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk, dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT), tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # earlier queries see none of these keys
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_len
        q_offs = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        do = tl.load(do_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        lse = tl.load(lse_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        delta = tl.load(delta_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        keep = m_mask[:, None] & n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)  # P = exp(S - L)
        ...  # dv, dp, ds, dk; then add this tile's share of dQ into dq_ptr + q_offs
        ### BEGIN SOLUTION
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_mask[:, None])
        ### END SOLUTION
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])


check("16.flash-bwd", my_flash_bwd_kernel)

# %% [markdown]
# labkit's kernels as one autograd op, `kernels.FlashAttention`: the forward saves Q, K, V, O and L, the backward
# launches the backward kernel. gradcheck in float64 on 20 positions (two key blocks, causal), then the fp32
# kernels against torch's gradients of `F.scaled_dot_product_attention` on 40 positions:

# %% [markdown] lang="zh" en="93174f85f68a"
# 把 labkit 的内核合成一个 autograd 算子 `kernels.FlashAttention`：前向保存 Q、K、V、O 和 L，反向启动反向内
# 核。先在 20 个位置上（两个键块，因果）以 float64 做 gradcheck，再在 40 个位置上把 fp32 内核与 torch 对
# `F.scaled_dot_product_attention` 求出的梯度对比：

# %%
q64, k64, v64 = (kernels.randn(1, 1, 20, 16, seed=s).double().requires_grad_() for s in (11, 12, 13))
ok = torch.autograd.gradcheck(lambda *t: kernels.FlashAttention.apply(*t, True), (q64, k64, v64), fast_mode=True)
print(f"gradcheck of FlashAttention forward + backward in float64 (causal, 20 positions): {ok}")
assert ok

# %%
qs, ks, vs = (kernels.randn(2, 2, 40, 16, seed=s).requires_grad_() for s in (14, 15, 16))
ref = [t.detach().double().requires_grad_() for t in (qs, ks, vs)]
do = kernels.randn(2, 2, 40, 16, seed=17)
kernels.FlashAttention.apply(qs, ks, vs, True).backward(do)
F.scaled_dot_product_attention(*ref, is_causal=True).backward(do.double())
oks = {name: kernels.close(mine.grad, theirs.grad)[0] for name, mine, theirs in zip("QKV", (qs, ks, vs), ref)}
print("fp32 kernels within tolerance of SDPA's float64 gradients: " + ", ".join(f"d{n} {ok}" for n, ok in oks.items()))
assert all(oks.values())

# %% [markdown]
# What the interpreter cannot show here: the atomics' contention and their run-to-run differences in fp32 (its
# programs run one after another, in one order), and whether the backward kernel is fast, which on a GPU depends on
# the same tile-size and `num_stages` trade-offs as the matmul. FlashAttention-2's backward does about 2.5 times the
# matmul work of its forward (five matmuls per tile, one of them recomputing S, against two), which is why its
# tuning matters. On a GPU the atomics also meet `gradcheck`, which runs the backward twice and by default demands
# the same bits (`nondet_tol=0`): here each dQ row gets at most two key blocks' shares, and two additions onto 0
# give the same result in either order, but with three or more the order can change the last bit. Pass a small
# `nondet_tol`, or use the deterministic two-loop backward.
#
# ## Summary
#
# - A tiled matmul reuses each loaded tile BLOCK_N (or BLOCK_M) times, accumulates in fp32 and masks M, N and K.
#   Grouped program order makes co-running programs share tiles in L2; `@triton.autotune` picks tile sizes,
#   `num_warps` and `num_stages` by timing them on the GPU, which the interpreter cannot.
# - The online softmax reads a row of any length in blocks, rescaling its running sum when the max grows, and it
#   is exact, not an approximation: the same two lines prove FlashAttention's rescaling.
# - A complete FlashAttention forward saves the logsumexp per row, stops the causal loop at the diagonal and uses
#   `exp2`; its tile sizes are bounded by the SM's on-chip memory.
# - A backward kernel recomputes what is cheap (P from L) and saves what is small (mean, rstd, L). Sums across
#   programs (LayerNorm's dW and db, FlashAttention's dQ) need a race-free plan: per-program partial buffers and
#   a second reduction, or atomics. `torch.autograd.gradcheck` in float64 checks a hand-written backward.
#
# Back in [notebook 08](08_triton_kernels.ipynb) the interpreter's limits are listed in full; notebook 09 goes on to
# several processes.

# %% [markdown] lang="zh" en="497daded82a4"
# 解释器在这里展示不了的有：原子操作的争用，以及它们在 fp32 下每次运行结果的差异（解释器的程序实例按同一种顺序
# 逐个运行）；还有反向内核够不够快，在 GPU 上这取决于与矩阵乘法相同的分块大小和 `num_stages` 的权衡。
# FlashAttention-2 的反向所做的矩阵乘法工作量约为前向的 2.5 倍（每个分块五次矩阵乘法，其中一次用于重新计算 S，
# 而前向只有两次），所以对它调优很重要。在 GPU 上，原子操作还会给 `gradcheck` 带来麻烦：`gradcheck` 会把反向运
# 行两次，并且默认要求结果逐位相同（`nondet_tol=0`）。在这里，每个 dQ 行最多只接收两个键块的份额，在 0 上做两
# 次加法，无论顺序如何结果都一样；但有三个或更多份额时，顺序就可能改变最后一位。这时可以传入一个较小的
# `nondet_tol`，或者改用确定性的双循环反向。
#
# ## 小结
#
# - 分块矩阵乘法把每个加载进来的分块复用 BLOCK_N（或 BLOCK_M）次，以 fp32 累加，并对 M、N、K 加掩码。
#   分组的程序实例顺序让同时运行的程序实例在 L2 中共享分块；`@triton.autotune` 通过在 GPU 上计时来选择分块大
#   小、`num_warps` 和 `num_stages`，这一点解释器做不到。
# - 在线 softmax 能分块读取任意长度的行，在最大值增大时重新缩放累计和；它是精确的，而不是近似：同样的两行推导
#   也证明了 FlashAttention 的重新缩放是精确的。
# - 完整的 FlashAttention 前向为每行保存 logsumexp，在对角线处截止因果循环，并使用 `exp2`；它的分块大小受 SM
#   片上存储的限制。
# - 反向内核重新计算代价低的东西（由 L 得到 P），保存占空间小的东西（mean、rstd、L）。跨程序实例的求和
#   （LayerNorm 的 dW 和 db、FlashAttention 的 dQ）需要一个没有数据竞争的方案：每个程序实例各用一块部分和缓冲
#   区，再做第二次归约；或者使用原子操作。float64 下的 `torch.autograd.gradcheck` 可以检查手写的反向传播。
#
# 回到 [notebook 08](08_triton_kernels.ipynb)，那里完整列出了解释器的各项限制；notebook 09 则进入多进程的内容。
