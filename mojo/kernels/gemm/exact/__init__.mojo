"""The exact GEMM: one rounding of an exact sum, the identical GEMM's form where the shape rule takes a product
(kernels/gemm/__init__.mojo). A file a role:

- definition.mojo: the definition (exponents, b, fixed point, rounding) and its plain SIMT form;
- exponents.mojo, residues.mojo, crt.mojo: the residue form's passes, each operand's line exponents and residue
  planes modulo coprime moduli, then the Chinese remainder theorem from the plane products' residues to X;
- forms.mojo: the passes in order for one product, products of one A, and summed products, with their workspace;
- fused_sm90.mojo: the plane products and the reconstruction as one Hopper kernel (wgmma, TMA);
- ranges.mojo: a product per k range, combined by the row tree;
- cpu_wide.mojo: the CPU's plane products, int16 residues modulo primes below 2^12 by AVX2's vpmaddwd.

Every form gives the definition's bits: integer arithmetic throughout, so no device, order or split of k changes one.
"""
