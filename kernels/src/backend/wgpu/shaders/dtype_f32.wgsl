// Weight prelude: the tensor is stored as f32.
// Every kernel that reads weights declares them at @group(0) @binding(1)
// through one of these preludes and reads element `i` with `w_at(i)`.

@group(0) @binding(1) var<storage, read> w: array<f32>;

fn w_at(i: u32) -> f32 {
    return w[i];
}
