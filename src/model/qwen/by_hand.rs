//! A decoder layer's backward written out by hand (issue #59, item 2): the layer run forward once
//! on detached weights, keeping the activations its backward reads, then every gradient computed
//! from the formulas below and written once, where candle's autograd records ~60 nodes a layer,
//! zero-fills a gradient buffer for each and adds into it. Only the attention keeps a graph of
//! its own (its kernel's backward: flash attention's, or the composed softmax's), three inputs
//! deep.
//!
//! The layer (Qwen2/Qwen3, `super::Block::forward`), per token row, with `·ᵀ` the weights as
//! stored (out, in):
//!
//! ```text
//! n₁ = rms(x)·w₁            q, k, v = n₁·Wqᵀ (+bq), n₁·Wkᵀ (+bk), n₁·Wvᵀ (+bv)
//! q̂, k̂ = rope(rms_h(q)·wq), rope(rms_h(k)·wk)      (Qwen3's per-head norms)
//! o = attention(q̂, k̂, v)   h = x + o·Woᵀ
//! n₂ = rms(h)·w₂            s = silu(n₂·Wgᵀ) ⊙ (n₂·Wuᵀ)      y = h + s·Wdᵀ
//! ```
//!
//! and its backward from `g = ∂L/∂y`, last to first:
//!
//! ```text
//! dWd = gᵀ·s            ds = g·Wd
//! dγ = ds ⊙ u ⊙ σ(γ)(1 + γ(1 − σ(γ)))     du = ds ⊙ silu(γ)          (γ = n₂·Wgᵀ, u = n₂·Wuᵀ)
//! dWg = dγᵀ·n₂  dWu = duᵀ·n₂  dn₂ = dγ·Wg + du·Wu
//! dh = g + rms_bwd(h, w₂, dn₂)                       dw₂ = Σ_rows dn₂ ⊙ rms(h)
//! dWo = dhᵀ·o   do = dh·Wo   dq̂, dk̂, dv = attention_bwd(do)
//! dq = rope(dq̂, cos, −sin) (rotations are orthogonal, and both halves of sin are equal)
//! dq = rms_bwd(q, wq, dq)   (likewise k)
//! dW· = d·ᵀ·n₁  db· = Σ_rows d·    dn₁ = dq·Wq + dk·Wk + dv·Wv
//! dx = dh + rms_bwd(x, w₁, dn₁)
//! ```
//!
//! with `rms_bwd(x, w, dn) = r·(dn⊙w − n̂·mean(dn⊙w⊙n̂))`, `n̂ = x·r`, `r = 1/√(mean(x²)+ε)`.
//! The forward runs the model's own ops (the fused RMSNorm and SwiGLU where they apply), and the
//! norms' and SwiGLU's backwards are their kernels' (`crate::fused::rms_norm_backward`,
//! `crate::fused::swiglu_backward`: one pass each on CPU f32 and CUDA, the formulas in f32
//! elsewhere); the two residual adds, `dh = g + …` and `dx = dh + …`, happen in the pass of the
//! norm beside them (`crate::fused::rms_norm_backward_add`). The composed layer under autograd is the
//! oracle (tests/it/model.rs): the same gradients to f32 round-off, at the Qwen3-1.7B layer's
//! shapes. Off by default ([`super::Kernels::layer_by_hand`]) until a GPU run times it against
//! the autograd layer. With it, the embedding's backward is written once too
//! ([`embedding_backward`]: the lookup's rows added to the tied lm_head's share in one pass,
//! `crate::fused::embedding_backward`), where autograd's `index_add` walks every position in
//! turn on CUDA.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, D};

use super::{AttnMask, Block, Linear, RmsNorm};
use crate::device::{
    part, BACKWARD_ATTENTION, BACKWARD_ELEMENTWISE, BACKWARD_MATMUL, BACKWARD_REST,
    FORWARD_ELEMENTWISE, SEED, TO_MASTERS,
};
use crate::model::Result;

/// RMSNorm's backward (`crate::fused::rms_norm_backward`: one kernel on CPU f32 and CUDA).
fn norm_backward(norm: &RmsNorm, x: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok(crate::fused::rms_norm_backward(
        x,
        &norm.weight,
        dy,
        norm.eps,
    )?)
}

/// The gradient of a residual stream `x` whose RMSNorm feeds the layer: `residual` (what
/// reaches `x` past the norm) plus the norm's backward, in the norm's pass
/// (`crate::fused::rms_norm_backward_add`), and the norm's weight gradient.
fn residual_norm_backward(
    norm: &RmsNorm,
    x: &Tensor,
    dy: &Tensor,
    residual: &Tensor,
) -> Result<(Tensor, Tensor)> {
    Ok(crate::fused::rms_norm_backward_add(
        x,
        &norm.weight,
        dy,
        residual,
        norm.eps,
    )?)
}

/// A linear layer's backward from its input `x` `(.., in)` and output gradient `dy` `(.., out)`:
/// `(dx, dW, db)`, each written once. A trace times its two products apart from the element-wise
/// work before them.
fn linear_backward(
    lin: &Linear,
    x: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let (inp, out) = (x.dim(D::Minus1)?, dy.dim(D::Minus1)?);
    let x2 = x.reshape(((), inp))?;
    let dy2 = dy.reshape(((), out))?;
    let w = lin.weight.detach();
    part(BACKWARD_ELEMENTWISE);
    let dx = crate::fused::matmul(&dy2, &w)?;
    let dw = crate::fused::matmul(&dy2.t()?, &x2)?;
    part(BACKWARD_MATMUL);
    let db = match &lin.bias {
        Some(_) => Some(dy2.sum(0)?),
        None => None,
    };
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("invariant: at least 1-D") = inp;
    Ok((dx.reshape(dims)?, dw, db))
}

/// The layer's gradients as they are made, keyed by the masters of the weights the layer read.
struct Kept<'m> {
    store: GradStore,
    /// The masters of the weights the model reads as casts (`Qwen::masters`).
    masters: &'m Masters,
}

/// A cast weight's id → its master (`Qwen::masters`).
pub(super) type Masters = std::collections::HashMap<candle_core::TensorId, Tensor>;

impl<'m> Kept<'m> {
    fn new(masters: &'m Masters) -> Kept<'m> {
        Kept {
            store: GradStore::default(),
            masters,
        }
    }

    /// A weight's gradient, written once: for a weight read as a cast of its master (bf16 from
    /// f32 on the GPU), the gradient cast to the master's dtype, keyed by the master, which is
    /// what the cast's backward would give it (candle adds it into a zero-filled gradient: the
    /// same value) without a seed, a sum or a zero fill on the way. A weight that is neither a
    /// master nor a cast of one (a detached model's: `Qwen::new` records every cast it makes
    /// otherwise) has no master to hand a gradient to, as under autograd. A trace times the cast
    /// apart ([`TO_MASTERS`]).
    fn insert(&mut self, weight: &Tensor, grad: Tensor) -> Result<()> {
        part(BACKWARD_ELEMENTWISE);
        let kept = self.keep(weight, grad);
        part(TO_MASTERS);
        kept
    }

    /// [`Kept::insert`] without its trace's parts.
    fn keep(&mut self, weight: &Tensor, grad: Tensor) -> Result<()> {
        if weight.is_variable() {
            // (the gradient's own dtype but for the embedding's f32 sums; a no-op otherwise)
            let grad = grad.to_dtype(weight.dtype())?;
            self.store.insert(weight, grad);
        } else if let Some(master) = self.masters.get(&weight.id()) {
            let grad = grad.to_dtype(master.dtype())?;
            self.store.insert(master, grad);
        }
        Ok(())
    }

    fn linear(&mut self, lin: &Linear, dw: Tensor, db: Option<Tensor>) -> Result<()> {
        self.insert(&lin.weight, dw)?;
        if let (Some(b), Some(db)) = (&lin.bias, db) {
            self.insert(b, db)?;
        }
        Ok(())
    }
}

impl Block {
    /// The layer's forward from `x` `(B, T, H)` and its backward from `g` = ∂L/∂y, by hand
    /// (module docs): returns ∂L/∂x and a store with the gradient of every parameter of the
    /// layer (keyed by this block's weights, as autograd's backward would give them). Training
    /// only: no KV cache, the whole sequence at once.
    pub(super) fn backward_by_hand(
        &self,
        x: &Tensor,
        g: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        masters: &Masters,
    ) -> Result<(Tensor, GradStore)> {
        let layer = self.detached();
        let attn = &layer.attn;
        let (b, t, _) = x.dims3()?;
        let x = x.detach();
        let g = g.detach();

        // Forward, keeping what the backward reads.
        let n1 = layer.input_norm.forward(&x)?;
        let (q, k, v) = attn.project(&n1)?; // tokens first: (B, T, heads, D)
        let (qn, kn) = match (&attn.q_norm, &attn.k_norm) {
            (Some(qn), Some(kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            _ => (q.clone(), k.clone()),
        };
        let q_rot = crate::fused::rope_heads(&qn, cos, sin)?; // (B, H, T, D)
        let k_rot = crate::fused::rope_heads(&kn, cos, sin)?; // (B, KV, T, D)
        let v_heads = v.transpose(1, 2)?.contiguous()?;
        // The attention is the one piece with a graph: its kernel's own backward.
        let leaf = |t: &Tensor| -> Result<Tensor> {
            Ok(candle_core::Var::from_tensor(t)?.as_tensor().clone())
        };
        let (q_var, k_var, v_var) = (leaf(&q_rot)?, leaf(&k_rot)?, leaf(&v_heads)?);
        let o_heads = attn.attend(&q_var, &k_var, &v_var, t, mask)?; // (B, H, T, D)
        let o = o_heads.detach().transpose(1, 2)?.contiguous()?.reshape((
            b,
            t,
            attn.heads * attn.head_dim,
        ))?;
        let h = (&x + attn.o.forward(&o)?)?;
        let n2 = layer.post_norm.forward(&h)?;
        let gate = layer.mlp.gate.forward(&n2)?;
        let up = layer.mlp.up.forward(&n2)?;
        let s = crate::fused::swiglu(&gate, &up)?;
        part(FORWARD_ELEMENTWISE);

        // Backward, last to first; `store` gets each gradient once.
        let mut store = Kept::new(masters);
        let (ds, dw_down, db_down) = linear_backward(&layer.mlp.down, &s, &g)?;
        store.linear(&self.mlp.down, dw_down, db_down)?;
        let (dgate, dup) = crate::fused::swiglu_backward(&gate, &up, &ds)?;
        let (dn2_g, dw_gate, db_gate) = linear_backward(&layer.mlp.gate, &n2, &dgate)?;
        let (dn2_u, dw_up, db_up) = linear_backward(&layer.mlp.up, &n2, &dup)?;
        store.linear(&self.mlp.gate, dw_gate, db_gate)?;
        store.linear(&self.mlp.up, dw_up, db_up)?;
        let (dh, dw_post) = residual_norm_backward(&layer.post_norm, &h, &(dn2_g + dn2_u)?, &g)?;
        store.insert(&self.post_norm.weight, dw_post)?;

        let (do_, dw_o, db_o) = linear_backward(&attn.o, &o, &dh)?;
        store.linear(&self.attn.o, dw_o, db_o)?;
        let do_heads = do_
            .reshape((b, t, attn.heads, attn.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        part(BACKWARD_ELEMENTWISE);
        let [dq_rot, dk_rot, dv_heads] =
            attention_backward(o_heads, &do_heads, [q_var, k_var, v_var])?;
        // the attention's inputs are done with too: gone before the projections' backward
        // allocates
        drop((q_rot, k_rot, v_heads));

        // The inverse rotation, back to tokens first (B, T, heads, D), in one pass.
        let minus_sin = sin.neg()?;
        let unrotate = |d: &Tensor| -> Result<Tensor> {
            Ok(crate::fused::rope_tokens_first(d, cos, &minus_sin)?)
        };
        let mut dq = unrotate(&dq_rot)?;
        let mut dk = unrotate(&dk_rot)?;
        let dv = dv_heads.transpose(1, 2)?.contiguous()?;
        if let (Some(qn), Some(kn)) = (&attn.q_norm, &attn.k_norm) {
            let (dq_in, dwq) = norm_backward(qn, &q, &dq)?;
            let (dk_in, dwk) = norm_backward(kn, &k, &dk)?;
            let (sq, sk) = (&self.attn.q_norm, &self.attn.k_norm);
            if let (Some(sq), Some(sk)) = (sq, sk) {
                store.insert(&sq.weight, dwq)?;
                store.insert(&sk.weight, dwk)?;
            }
            (dq, dk) = (dq_in, dk_in);
        }
        let flat = |d: Tensor, heads: usize| d.reshape((b, t, heads * attn.head_dim));
        let (dn1_q, dw_q, db_q) = linear_backward(&attn.q, &n1, &flat(dq, attn.heads)?)?;
        let (dn1_k, dw_k, db_k) = linear_backward(&attn.k, &n1, &flat(dk, attn.kv_heads)?)?;
        let (dn1_v, dw_v, db_v) = linear_backward(&attn.v, &n1, &flat(dv, attn.kv_heads)?)?;
        store.linear(&self.attn.q, dw_q, db_q)?;
        store.linear(&self.attn.k, dw_k, db_k)?;
        store.linear(&self.attn.v, dw_v, db_v)?;
        let dn1 = ((dn1_q + dn1_k)? + dn1_v)?;
        let (dx, dw_in) = residual_norm_backward(&layer.input_norm, &x, &dn1, &dh)?;
        store.insert(&self.input_norm.weight, dw_in)?;
        part(BACKWARD_ELEMENTWISE);
        Ok((dx, store.store))
    }
}

/// The attention's backward through its own graph (its kernel's backward, the one piece of the
/// layer with a graph): the gradients of its three leaves `[q, k, v]` from its output `o` and
/// the output's gradient `d_o`. The output, the leaves and the graph are gone when it returns.
fn attention_backward(o: Tensor, d_o: &Tensor, leaves: [Tensor; 3]) -> Result<[Tensor; 3]> {
    let seed = crate::fused::backward_seed(&o, d_o)?;
    part(SEED);
    let mut grads = seed.backward()?;
    drop((seed, o));
    let [dq, dk, dv] = leaves.map(|leaf| {
        grads
            .remove(&leaf)
            .ok_or_else(|| candle_core::Error::Msg("attention: an input without a gradient".into()))
    });
    // Flash attention's backward times its kernels itself, and calls what came before them the
    // rest of the backward: here the seed's own backward, element-wise passes; after it,
    // candle's gradient store adds its three gradients in (element-wise too). The composed
    // attention's backward has no parts of its own: all of it is the attention's.
    let flash = crate::device::fold_part(BACKWARD_REST, BACKWARD_ELEMENTWISE);
    part(if flash {
        BACKWARD_ELEMENTWISE
    } else {
        BACKWARD_ATTENTION
    });
    Ok([dq?, dk?, dv?])
}

/// Whether `weight` gets a gradient: a variable itself, or a cast of a master (`Qwen::masters`);
/// a frozen model's weight has neither, and [`Kept::insert`] drops what it is given.
pub(super) fn trained(weight: &Tensor, masters: &Masters) -> bool {
    weight.is_variable() || masters.contains_key(&weight.id())
}

/// The embedding matrix's gradient from `g` = ∂L/∂x₀, the gradient of the lookup whose ids
/// `rows` grouped (the first layer's input), written once (`crate::fused::embedding_backward`):
/// with tied embeddings starting from the lm_head's share `g_lm`, as autograd adds the lookup's
/// rows into it. Keyed as [`Kept::insert`] keys a weight's gradient: by the weight, or by its
/// master. For a [`trained`] weight: the caller groups no ids for a frozen one.
pub(super) fn embedding_backward(
    weight: &Tensor,
    rows: &crate::fused::TokenRows,
    g: &Tensor,
    g_lm: Option<&Tensor>,
    masters: &Masters,
) -> Result<GradStore> {
    let grad = crate::fused::embedding_backward(rows, &g.detach(), g_lm)?;
    let mut store = Kept::new(masters);
    store.insert(weight, grad)?;
    Ok(store.store)
}
