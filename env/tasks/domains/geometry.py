"""Domain: plane polygons (area, perimeter, centre, bounding boxes, convexity)."""

from env.tasks.domains.base import Derived, Domain, Fn, Scenario, ints, pick

GEOMETRY = Domain(
    key="geometry",
    packages=("planekit", "figura", "polyline", "shapebox"),
    doc="Plane polygons: area, perimeter, centre, bounding boxes.",
    modules={
        0: ("vectors", "points", "coords"),
        1: ("measure", "metrics", "calc"),
        2: ("polygons", "shapes"),
    },
    module_docs={
        0: "2-D points as (x, y) tuples.",
        1: "Measures of point sequences.",
        2: "The polygon type.",
    },
    names={
        "sub": ("sub", "minus", "delta"),
        "cross": ("cross", "cross_z", "wedge"),
        "dist": ("dist", "distance", "length_between"),
        "scale_point": ("scale_point", "stretch", "scaled_about"),
        "bounds": ("bounds", "extent", "bbox"),
        "perimeter": ("perimeter", "path_length", "ring_length"),
        "shoelace": ("shoelace", "signed_area", "twice_area"),
        "centroid": ("centroid", "mean_point", "average_point"),
        "turns": ("turns", "turn_signs", "orientations"),
        "Polygon": ("Polygon", "Shape", "Outline"),
        "area": ("area", "surface"),
        "length": ("length", "circumference"),
        "center": ("center", "middle"),
        "fits_in": ("fits_in", "fits", "fits_box"),
        "is_convex": ("is_convex", "convex"),
        "scaled": ("scaled", "resized", "zoomed"),
    },
    functions=(
        Fn(
            "sub",
            0,
            '''
def ${sub}(a, b):
    """The vector from `b` to `a`."""
    return (a[0] - b[0], a[1] - b[1])
''',
        ),
        Fn(
            "cross",
            0,
            '''
def ${cross}(a, b):
    """z component of the cross product of two 2-D vectors."""
    return a[0] * b[1] - a[1] * b[0]
''',
        ),
        Fn(
            "dist",
            0,
            '''
def ${dist}(a, b):
    """Euclidean distance between two points."""
    dx = b[0] - a[0]
    dy = b[1] - a[1]
    return (dx * dx + dy * dy) ** 0.5
''',
        ),
        Fn(
            "scale_point",
            0,
            '''
def ${scale_point}(point, origin, factor):
    """`point` moved away from `origin` by `factor`."""
    x = origin[0] + (point[0] - origin[0]) * factor
    y = origin[1] + (point[1] - origin[1]) * factor
    return (round(x, 3), round(y, 3))
''',
        ),
        Fn(
            "bounds",
            0,
            '''
def ${bounds}(points):
    """(min_x, min_y, max_x, max_y) of the points."""
    low_x, low_y = points[0]
    high_x, high_y = points[0]
    for x, y in points[1:]:
        if x < low_x:
            low_x = x
        if x > high_x:
            high_x = x
        if y < low_y:
            low_y = y
        if y > high_y:
            high_y = y
    return (low_x, low_y, high_x, high_y)
''',
        ),
        Fn(
            "perimeter",
            1,
            '''
def ${perimeter}(points):
    """Length of the closed path through the points."""
    total = 0
    for i in range(len(points)):
        total += ${dist}(points[i - 1], points[i])
    return round(total, 3)
''',
        ),
        Fn(
            "shoelace",
            1,
            '''
def ${shoelace}(points):
    """Twice the signed area of the polygon (shoelace formula); positive when counter-clockwise."""
    twice = 0
    for i in range(len(points)):
        twice += ${cross}(points[i - 1], points[i])
    return twice
''',
        ),
        Fn(
            "centroid",
            1,
            '''
def ${centroid}(points):
    """Mean of the points."""
    sx = 0
    sy = 0
    for x, y in points:
        sx += x
        sy += y
    count = len(points)
    return (round(sx / count, 3), round(sy / count, 3))
''',
        ),
        Fn(
            "turns",
            1,
            '''
def ${turns}(points):
    """For each corner, whether the path turns left (None where it goes straight on)."""
    n = len(points)
    signs = []
    for i in range(n):
        edge = ${sub}(points[(i + 1) % n], points[i])
        following = ${sub}(points[(i + 2) % n], points[(i + 1) % n])
        turn = ${cross}(edge, following)
        signs.append(turn > 0 if turn != 0 else None)
    return signs
''',
        ),
        Fn(
            "Polygon",
            2,
            '''
class ${Polygon}:
    """A simple polygon given by its corners in order."""

    def __init__(self, points):
        if len(points) < 3:
            raise ValueError("a polygon needs at least 3 corners")
        self.points = [tuple(p) for p in points]

    def ${area}(self):
        """The enclosed area."""
        return abs(${shoelace}(self.points)) / 2

    def ${length}(self):
        """The perimeter."""
        return ${perimeter}(self.points)

    def ${center}(self):
        """The mean of the corners."""
        return ${centroid}(self.points)

    def ${fits_in}(self, width, height):
        """Whether the bounding box fits in a `width` x `height` box."""
        low_x, low_y, high_x, high_y = ${bounds}(self.points)
        return high_x - low_x <= width and high_y - low_y <= height

    def ${is_convex}(self):
        """Whether every corner turns the same way."""
        signs = [s for s in ${turns}(self.points) if s is not None]
        return all(signs) or not any(signs)

    def ${scaled}(self, factor):
        """A copy grown by `factor` about the centre."""
        origin = ${centroid}(self.points)
        return ${Polygon}([${scale_point}(p, origin, factor) for p in self.points])
''',
        ),
    ),
    scenarios=(
        Scenario(
            "rectangle_${area}",
            "the area of a rectangle",
            ("shape = ${Polygon}([(0, 0), (${w}, 0), (${w}, ${h}), (0, ${h})])",),
            "shape.${area}()",
            {"w": ints(2, 12), "h": ints(2, 12)},
        ),
        Scenario(
            "triangle_${area}",
            "the area of a triangle",
            ("shape = ${Polygon}([(${x}, 0), (${w}, ${y}), (0, ${h})])",),
            "shape.${area}()",
            {"x": ints(0, 3), "y": ints(1, 4), "w": ints(5, 9), "h": ints(4, 9)},
        ),
        Scenario(
            "square_${length}",
            "the perimeter of a square",
            ("shape = ${Polygon}([(0, 0), (${s}, 0), (${s}, ${s}), (0, ${s})])",),
            "shape.${length}()",
            {"s": ints(2, 15)},
        ),
        Scenario(
            "right_triangle_${length}",
            "the perimeter of a right triangle",
            ("shape = ${Polygon}([(0, 0), (${a}, 0), (0, ${b})])",),
            "shape.${length}()",
            {"a": pick(3, 6, 5, 8), "b": pick(4, 8, 12, 15)},
        ),
        Scenario(
            "${center}_of_quad",
            "the centre of a quadrilateral",
            ("shape = ${Polygon}([(${a}, 0), (${b}, 1), (${c}, ${d}), (0, ${e})])",),
            "shape.${center}()",
            {"a": ints(0, 3), "b": ints(5, 9), "c": ints(4, 8), "d": ints(5, 9), "e": ints(3, 7)},
        ),
        Scenario(
            "${fits_in}_small_box",
            "whether a shape fits in a box that is too small",
            ("shape = ${Polygon}([(${x}, ${y}), (${x2}, ${y}), (${x}, ${y2})])",),
            "shape.${fits_in}(${w}, ${h1})",
            {
                "x": ints(-5, 5),
                "y": ints(-5, 5),
                "w": ints(2, 9),
                "h": ints(2, 9),
                "x2": Derived(lambda v: v["x"] + v["w"]),
                "y2": Derived(lambda v: v["y"] + v["h"]),
                "h1": Derived(lambda v: v["h"] - 1),
            },
        ),
        Scenario(
            "${fits_in}_exact_box",
            "whether a shape fits in a box of its own size",
            ("shape = ${Polygon}([(${x}, ${y}), (${x2}, ${y}), (${x2}, ${y2})])",),
            "shape.${fits_in}(${w}, ${h})",
            {
                "x": ints(-5, 5),
                "y": ints(-5, 5),
                "w": ints(2, 9),
                "h": ints(2, 9),
                "x2": Derived(lambda v: v["x"] + v["w"]),
                "y2": Derived(lambda v: v["y"] + v["h"]),
            },
        ),
        Scenario(
            "arrow_not_${is_convex}",
            "the convexity check of an arrow shape",
            ("shape = ${Polygon}([(0, 0), (${w}, ${h}), (0, ${h2}), (${d}, ${h})])",),
            "shape.${is_convex}()",
            {"w": ints(4, 8), "h": ints(2, 4), "h2": ints(5, 9), "d": ints(1, 3)},
        ),
        Scenario(
            "square_${is_convex}",
            "the convexity check of a square",
            ("shape = ${Polygon}([(0, 0), (${s}, 0), (${s}, ${s}), (0, ${s})])",),
            "shape.${is_convex}()",
            {"s": ints(1, 9)},
        ),
        Scenario(
            "${scaled}_corners",
            "the corners of a scaled shape",
            ("shape = ${Polygon}([(0, 0), (${w}, 0), (${w}, ${h}), (0, ${h})])",),
            "shape.${scaled}(${f}).points",
            {"w": pick(2, 4, 6), "h": pick(2, 4, 8), "f": pick(2, 3, 0.5)},
        ),
        Scenario(
            "too_few_corners",
            "a polygon with two corners",
            (),
            "${Polygon}([(0, 0), (${a}, ${b})])",
            {"a": ints(1, 9), "b": ints(1, 9)},
            raises="ValueError",
        ),
    ),
)
